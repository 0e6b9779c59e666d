//! Registering files and folders as tables: format detection and clear errors for missing,
//! unreadable or corrupt data.
//!
//! Contract: a file's format comes from its extension; a folder's from the extensions of the
//! data files in it, which must agree. Hidden files (`.` or `_` prefix) are ignored, as Spark
//! and DataFusion ignore them.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::error::{Result, SpateError};

/// A file format Spate can register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileFormat {
    /// Apache Parquet.
    Parquet,
    /// Comma-separated values with a header row.
    Csv,
    /// Newline-delimited JSON, one object per line.
    NdJson,
    /// Arrow IPC file format (Feather v2).
    ArrowIpc,
}

impl FileFormat {
    /// Every format, with the extensions that select it.
    const EXTENSIONS: [(FileFormat, &'static [&'static str]); 4] = [
        (FileFormat::Parquet, &["parquet", "parq", "pq"]),
        (FileFormat::Csv, &["csv", "tsv"]),
        (FileFormat::NdJson, &["json", "ndjson", "jsonl"]),
        (FileFormat::ArrowIpc, &["arrow", "ipc", "feather", "arrows"]),
    ];

    /// The format an extension (without the dot, any case) selects.
    pub fn from_extension(extension: &str) -> Option<Self> {
        let extension = extension.to_ascii_lowercase();
        Self::EXTENSIONS
            .iter()
            .find(|(_, exts)| exts.contains(&extension.as_str()))
            .map(|(format, _)| *format)
    }

    /// Detects the format of a file or folder, checking that it exists.
    pub fn detect(path: &Path) -> Result<(Self, String)> {
        let shown = path.display().to_string();
        let meta = std::fs::metadata(path).map_err(|e| SpateError::Source {
            path: shown.clone(),
            message: match e.kind() {
                std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
                std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
                _ => e.to_string(),
            },
        })?;
        if meta.is_file() {
            let extension = extension_of(path).ok_or_else(|| unknown_format(&shown, None))?;
            let format = Self::from_extension(&extension)
                .ok_or_else(|| unknown_format(&shown, Some(&extension)))?;
            return Ok((format, extension));
        }
        let entries = std::fs::read_dir(path).map_err(|e| SpateError::Source {
            path: shown.clone(),
            message: format!("cannot list folder: {e}"),
        })?;
        let mut found: Option<(Self, String)> = None;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let Some(extension) = extension_of(&entry.path()) else {
                continue;
            };
            let Some(format) = Self::from_extension(&extension) else {
                continue;
            };
            match &found {
                None => found = Some((format, extension)),
                Some((seen, seen_ext)) if *seen != format || *seen_ext != extension => {
                    return Err(SpateError::Source {
                        path: shown,
                        message: format!(
                            "folder mixes .{seen_ext} and .{extension} files; a table's folder \
                             must hold files of one format"
                        ),
                    });
                }
                Some(_) => {}
            }
        }
        found.ok_or_else(|| SpateError::Source {
            path: shown,
            message: "folder holds no .parquet, .csv, .json/.ndjson or .arrow files".to_string(),
        })
    }
}

impl FromStr for FileFormat {
    type Err = SpateError;

    /// A format by name, any case: `parquet`, `csv`, `ndjson` (or `json`), `arrow` (or `ipc`,
    /// `feather`), or any other extension that selects a format.
    fn from_str(name: &str) -> Result<Self> {
        Self::from_extension(name.trim()).ok_or_else(|| SpateError::Config {
            message: format!(
                "unknown file format '{name}': expected parquet, csv, ndjson or arrow"
            ),
        })
    }
}

impl fmt::Display for FileFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileFormat::Parquet => "Parquet",
            FileFormat::Csv => "CSV",
            FileFormat::NdJson => "NDJSON",
            FileFormat::ArrowIpc => "Arrow IPC",
        })
    }
}

fn extension_of(path: &Path) -> Option<String> {
    path.extension().map(|e| e.to_string_lossy().into_owned())
}

fn unknown_format(path: &str, extension: Option<&str>) -> SpateError {
    let what = match extension {
        Some(ext) => format!("unknown file extension '.{ext}'"),
        None => "file has no extension".to_string(),
    };
    SpateError::Source {
        path: path.to_string(),
        message: format!(
            "{what}: name the file .parquet, .csv, .json/.ndjson or .arrow so its format is known"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_select_formats() {
        assert_eq!(
            FileFormat::from_extension("PARQUET"),
            Some(FileFormat::Parquet)
        );
        assert_eq!(
            FileFormat::from_extension("jsonl"),
            Some(FileFormat::NdJson)
        );
        assert_eq!(
            FileFormat::from_extension("feather"),
            Some(FileFormat::ArrowIpc)
        );
        assert_eq!(FileFormat::from_extension("xlsx"), None);
    }

    #[test]
    fn formats_parse_by_name() {
        assert_eq!(
            "Parquet".parse::<FileFormat>().unwrap(),
            FileFormat::Parquet
        );
        assert_eq!("json".parse::<FileFormat>().unwrap(), FileFormat::NdJson);
        assert_eq!(" ipc ".parse::<FileFormat>().unwrap(), FileFormat::ArrowIpc);
        let err = "xlsx".parse::<FileFormat>().unwrap_err();
        assert!(matches!(err, SpateError::Config { .. }), "{err:?}");
        assert!(
            err.to_string().contains("unknown file format 'xlsx'"),
            "{err}"
        );
    }

    #[test]
    fn detection_reports_missing_unknown_and_mixed() {
        let dir = tempfile::tempdir().unwrap();
        let missing = FileFormat::detect(&dir.path().join("nope.parquet")).unwrap_err();
        assert!(
            missing.to_string().ends_with("no such file or directory"),
            "{missing}"
        );

        let odd = dir.path().join("data.xlsx");
        std::fs::write(&odd, "x").unwrap();
        let err = FileFormat::detect(&odd).unwrap_err().to_string();
        assert!(err.contains("unknown file extension '.xlsx'"), "{err}");

        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(FileFormat::detect(&empty).is_err());

        let mixed = dir.path().join("mixed");
        std::fs::create_dir(&mixed).unwrap();
        std::fs::write(mixed.join("a.csv"), "a\n1\n").unwrap();
        std::fs::write(mixed.join("_SUCCESS"), "").unwrap();
        assert_eq!(FileFormat::detect(&mixed).unwrap().0, FileFormat::Csv);
        std::fs::write(mixed.join("b.parquet"), "x").unwrap();
        let err = FileFormat::detect(&mixed).unwrap_err().to_string();
        assert!(err.contains("mixes"), "{err}");
    }
}
