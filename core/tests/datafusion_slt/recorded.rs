//! The files each backend passes on record ([`PASSING_FILE`]), and what a full run does with
//! them.
//!
//! A recorded file that fails is run once more on that backend, alone:
//! - failing again, it is a regression, named with its first failure, and the run fails;
//! - passing, it is reported as flaky, with the failure of its first run, and the run goes on
//!   (DataFusion's suite has records whose result depends on timing or on the order of ties).
//!
//! A file passing that is not on record is good news: the run asks for the record to be
//! updated, which `SPATE_DF_SLT_RECORD=1` does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use spate::Backend;

use crate::{FileReport, ModeRun, Outcome, print_truncated};

/// Files passing per backend, a line each: `cpu <path>` or `emulated <path>`, paths relative
/// to DataFusion's `test_files/`.
const PASSING_FILE: &str = "testdata/datafusion-slt-passing.txt";

const HEADER: &str = "\
# Files of DataFusion 55.2's .slt suite that pass through Spate, per backend
# (core/tests/datafusion_slt.rs): `cpu` is Spate with GPU offload off, `emulated` with it on.
# A full run in which a file listed here fails twice on its backend fails, naming the file; one
# that passes a file not listed asks for this file to be updated (SPATE_DF_SLT_RECORD=1 does it),
# so that the gain is kept.
";

fn path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(PASSING_FILE)
}

/// The recorded passing files.
pub(crate) struct Recorded {
    cpu: BTreeSet<PathBuf>,
    emulated: BTreeSet<PathBuf>,
}

impl Recorded {
    pub(crate) fn load() -> Result<Self, String> {
        let text = std::fs::read_to_string(path())
            .map_err(|e| format!("cannot read {PASSING_FILE}: {e}"))?;
        let mut recorded = Recorded {
            cpu: BTreeSet::new(),
            emulated: BTreeSet::new(),
        };
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once(' ') {
                Some(("cpu", file)) => recorded.cpu.insert(PathBuf::from(file.trim())),
                Some(("emulated", file)) => recorded.emulated.insert(PathBuf::from(file.trim())),
                _ => {
                    return Err(format!(
                        "{PASSING_FILE}:{}: expected `cpu <path>` or `emulated <path>`, found \
                         `{line}`",
                        n + 1
                    ));
                }
            };
        }
        Ok(recorded)
    }

    fn of(&self, backend: Backend) -> &BTreeSet<PathBuf> {
        match backend {
            Backend::Emulated => &self.emulated,
            _ => &self.cpu,
        }
    }
}

/// A recorded file that failed once and passed when run again.
pub(crate) struct Flaky {
    relative: PathBuf,
    backend: Backend,
    first: ModeRun,
}

impl FileReport {
    fn run(&self, backend: Backend) -> &ModeRun {
        match backend {
            Backend::Emulated => &self.emulated,
            _ => &self.cpu,
        }
    }

    fn run_mut(&mut self, backend: Backend) -> &mut ModeRun {
        match backend {
            Backend::Emulated => &mut self.emulated,
            _ => &mut self.cpu,
        }
    }
}

/// Runs each recorded file that failed once more on its backend (with `rerun`), keeping the
/// second outcome in `reports`; returns the files that passed the second time.
pub(crate) fn rerun_failed(
    reports: &mut [FileReport],
    recorded: &Recorded,
    rerun: impl Fn(&Path, Backend) -> ModeRun,
) -> Vec<Flaky> {
    let mut flaky = Vec::new();
    for report in reports.iter_mut() {
        for backend in [Backend::Cpu, Backend::Emulated] {
            let listed = recorded.of(backend).contains(&report.relative);
            if !listed || report.run(backend).passed() {
                continue;
            }
            println!(
                "datafusion slt: {} failed on {backend}, where it passes on record; running it \
                 again",
                report.relative.display()
            );
            let second = rerun(&report.relative, backend);
            let first = std::mem::replace(report.run_mut(backend), second);
            if report.run(backend).passed() {
                flaky.push(Flaky {
                    relative: report.relative.clone(),
                    backend,
                    first,
                });
            }
        }
    }
    flaky
}

/// Reports flaky files, and compares the passing files with the record: a recorded file that
/// does not pass is a failure. Returns whether the record holds.
pub(crate) fn check(reports: &[FileReport], recorded: &Recorded, flaky: &[Flaky]) -> bool {
    for f in flaky {
        println!(
            "datafusion slt: FLAKY {} on {}: failed, then passed when run again; the first run's \
             failure:",
            f.relative.display(),
            f.backend
        );
        for failure in f.first.failures().iter().take(1) {
            print_truncated(&failure.message);
        }
    }
    let mut holds = true;
    let mut gained = false;
    for backend in [Backend::Cpu, Backend::Emulated] {
        let passing: BTreeSet<&PathBuf> = reports
            .iter()
            .filter(|r| r.run(backend).passed())
            .map(|r| &r.relative)
            .collect();
        let want = recorded.of(backend);
        let lost: Vec<&FileReport> = reports
            .iter()
            .filter(|r| want.contains(&r.relative) && !passing.contains(&r.relative))
            .collect();
        // A recorded file no longer in the suite at all (renamed, removed) is lost too.
        let missing: Vec<&PathBuf> = want
            .iter()
            .filter(|p| !reports.iter().any(|r| &r.relative == *p))
            .collect();
        let new: Vec<&&PathBuf> = passing.iter().filter(|p| !want.contains(**p)).collect();
        for r in &lost {
            holds = false;
            eprintln!(
                "datafusion slt: {} fails on {backend} (twice), where it passes on record in \
                 {PASSING_FILE}: a regression",
                r.relative.display()
            );
            for failure in r.run(backend).failures().iter().take(1) {
                print_truncated(&failure.message);
            }
        }
        for p in &missing {
            holds = false;
            eprintln!(
                "datafusion slt: {} is on record for {backend} in {PASSING_FILE} but did not run",
                p.display()
            );
        }
        for p in &new {
            gained = true;
            println!(
                "datafusion slt: {} passes on {backend}, and is not on record",
                p.display()
            );
        }
        println!(
            "datafusion slt: {backend} passes {} files, {} on record ({} lost, {} gained)",
            passing.len(),
            want.len(),
            lost.len() + missing.len(),
            new.len()
        );
    }
    if std::env::var("SPATE_DF_SLT_RECORD").is_ok_and(|v| v == "1") {
        match write(reports) {
            Ok(()) => println!("datafusion slt: wrote {PASSING_FILE}"),
            Err(e) => {
                eprintln!("cannot write {PASSING_FILE}: {e}");
                holds = false;
            }
        }
    } else if gained {
        println!(
            "datafusion slt: more files pass than are on record: keep the gain with \
             SPATE_DF_SLT_RECORD=1"
        );
    }
    holds
}

fn write(reports: &[FileReport]) -> std::io::Result<()> {
    let mut text = HEADER.to_string();
    for backend in [Backend::Cpu, Backend::Emulated] {
        for r in reports {
            if matches!(r.run(backend).outcome, Outcome::Passed) {
                text.push_str(&format!("{backend} {}\n", r.relative.display()));
            }
        }
    }
    std::fs::write(path(), text)
}
