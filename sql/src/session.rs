//! Runs shell input: SQL statements and backslash commands, with output, timing, progress and
//! cancellation.
//!
//! Contract: an error in one statement is printed as `Error: …` on stderr with its position
//! when known, and reported to the caller (scripts stop at the first failure; the interactive
//! shell carries on). Nothing here panics on user input.

use std::io::{IsTerminal, Write};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comfy_table::Table;
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressFinish, ProgressStyle};
use spate::{Engine, GpuInventory, SpateError};
use tokio::runtime::Runtime;

use crate::format::{OutputFormat, ResultWriter};
use crate::script::{self, Item};

/// What the caller should do after a piece of input ran.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep going.
    Continue,
    /// The user asked to quit.
    Quit,
}

/// A failure that has already been reported on stderr.
#[derive(Debug)]
pub struct Reported;

/// Where input came from, for error messages.
#[derive(Debug, Clone)]
pub enum Origin {
    /// `-c` text, standard input or the interactive prompt.
    Inline,
    /// A script file.
    File(String),
}

/// A shell session over one engine.
pub struct Session {
    engine: Engine,
    runtime: Runtime,
    format: OutputFormat,
    max_rows: Option<usize>,
    timing: bool,
    interactive: bool,
    /// Table and column names offered by completion, refreshed after each statement.
    completions: Arc<Mutex<Vec<String>>>,
}

impl Session {
    /// Starts reading standard input into stream `stream`, lines of `format`, once the
    /// session has it (`None` before).
    pub fn start_feed(
        &self,
        stream: &str,
        format: spate::FileFormat,
    ) -> Result<Option<spate::Feed>, String> {
        if !self.engine.has_stream(stream) {
            return Ok(None);
        }
        let _inside = self.runtime.enter();
        self.engine
            .feed(stream, std::io::stdin(), format, "stdin")
            .map(Some)
            .map_err(|e| format!("--stdin-into {stream}: {e}"))
    }

    /// Waits for a feed to read its source to the end; returns the rows it pushed.
    pub fn wait_feed(&self, feed: spate::Feed) -> Result<u64, String> {
        self.runtime
            .block_on(feed.wait())
            .map_err(|e| format!("--stdin-into: {e}"))
    }

    /// A session printing results in `format`. `interactive` enables the progress spinner and
    /// Ctrl-C cancellation.
    pub fn new(
        engine: Engine,
        runtime: Runtime,
        format: OutputFormat,
        max_rows: Option<usize>,
        interactive: bool,
    ) -> Self {
        let session = Session {
            engine,
            runtime,
            format,
            max_rows,
            timing: false,
            interactive,
            completions: Arc::default(),
        };
        session.refresh_completions();
        session
    }

    /// The names completion offers; shared with the line editor.
    pub fn completions(&self) -> Arc<Mutex<Vec<String>>> {
        Arc::clone(&self.completions)
    }

    /// Runs all of `input`, stopping at the first failure. Text after the last `;` runs as a
    /// final statement.
    pub fn run(&mut self, input: &str, origin: &Origin) -> Result<Flow, Reported> {
        let split = script::split(input);
        let mut items = split.items;
        if let Some((text, line_offset, column_offset)) = split.rest {
            items.push(Item::Sql {
                text,
                line_offset,
                column_offset,
            });
        }
        for item in items {
            if self.run_item(item, origin)? == Flow::Quit {
                return Ok(Flow::Quit);
            }
        }
        Ok(Flow::Continue)
    }

    fn run_item(&mut self, item: Item, origin: &Origin) -> Result<Flow, Reported> {
        match item {
            Item::Command(command) => self.run_command(&command),
            Item::Sql {
                text,
                line_offset,
                column_offset,
            } => {
                let started = Instant::now();
                // A panic is a bug (the panic hook has reported it); contain it so that the
                // shell survives and scripts fail with an error instead of an abort.
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    match crate::streams::subscribe_target(&text) {
                        Some(view) => self.subscribe(&view),
                        None => self.run_sql(&text),
                    }
                }))
                .unwrap_or(Err(RunError::Panicked));
                if self.interactive {
                    self.refresh_completions();
                }
                match result {
                    Ok(()) => {
                        if self.timing {
                            let ms = started.elapsed().as_secs_f64() * 1000.0;
                            self.print(&format!("Time: {ms:.3} ms"))?;
                        }
                        Ok(Flow::Continue)
                    }
                    Err(RunError::Closed) => Ok(Flow::Quit),
                    Err(RunError::Output(message)) => {
                        eprintln!("Error: cannot write the result: {message}");
                        Err(Reported)
                    }
                    Err(RunError::Cancelled) => {
                        eprintln!("Error: query cancelled");
                        Err(Reported)
                    }
                    Err(RunError::Panicked) => Err(Reported),
                    Err(RunError::Engine(err)) => {
                        report(&err, &text, line_offset, column_offset, origin);
                        Err(Reported)
                    }
                }
            }
        }
    }

    fn run_sql(&self, text: &str) -> Result<(), RunError> {
        let work = async {
            let statements = self.engine.parse(text)?;
            for statement in statements {
                // One spinner per statement; it clears itself when dropped, including when a
                // cancelled query drops this future.
                let progress = self.progress();
                let frame = self.engine.execute_statement(statement).await?;
                let schema = Arc::clone(frame.schema().inner());
                let mut stream = frame.execute_stream().await.map_err(SpateError::from)?;
                let mut stdout = std::io::stdout();
                let mut writer = ResultWriter::new(self.format, &mut stdout, schema, self.max_rows);
                while let Some(batch) = stream.next().await {
                    let batch = batch.map_err(SpateError::from)?;
                    writer.write(&batch).map_err(output_error)?;
                    if let Some(bar) = &progress {
                        bar.set_message(format!("{} rows", writer.total_rows()));
                    }
                }
                drop(progress);
                writer.finish().map_err(output_error)?;
                stdout.flush().map_err(output_error)?;
            }
            Ok(())
        };
        if self.interactive {
            self.runtime.block_on(async {
                tokio::select! {
                    result = work => result,
                    _ = tokio::signal::ctrl_c() => Err(RunError::Cancelled),
                }
            })
        } else {
            self.runtime.block_on(work)
        }
    }

    /// `SUBSCRIBE view`: prints each batch the view emits as it comes, until Ctrl-C.
    fn subscribe(&self, view: &str) -> Result<(), RunError> {
        let mut subscription = self.engine.subscribe(view)?;
        eprintln!("Subscribed to {view}: its rows print as they are emitted; Ctrl-C stops.");
        let work = async {
            while let Some(batch) = subscription.next_batch().await {
                let mut stdout = std::io::stdout();
                let mut writer =
                    ResultWriter::new(self.format, &mut stdout, batch.schema(), self.max_rows);
                writer.write(&batch).map_err(output_error)?;
                writer.finish().map_err(output_error)?;
                stdout.flush().map_err(output_error)?;
            }
            Ok(())
        };
        self.runtime.block_on(async {
            tokio::select! {
                result = work => result,
                _ = tokio::signal::ctrl_c() => Ok(()),
            }
        })
    }

    /// A spinner on stderr for the interactive shell; none for scripts and pipes.
    fn progress(&self) -> Option<ProgressBar> {
        if !self.interactive || !std::io::stderr().is_terminal() {
            return None;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
            .with_finish(ProgressFinish::AndClear);
        bar.set_style(
            ProgressStyle::with_template("{spinner} running {elapsed} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Some(bar)
    }

    fn run_command(&mut self, command: &str) -> Result<Flow, Reported> {
        let mut words = command.split_whitespace();
        let name = words.next().unwrap_or_default();
        let args: Vec<&str> = words.collect();
        match (name, args.as_slice()) {
            ("\\q" | "\\quit" | ".quit" | ".exit", _) => return Ok(Flow::Quit),
            ("\\?" | "\\h" | "\\help" | ".help", _) => self.print(HELP)?,
            ("\\timing" | ".timer", rest) => {
                self.timing = match rest {
                    [] => !self.timing,
                    ["on"] => true,
                    ["off"] => false,
                    _ => return usage_error(command, "\\timing [on|off]"),
                };
                let state = if self.timing { "on" } else { "off" };
                self.print(&format!("Timing is {state}."))?;
            }
            ("\\d" | ".tables", []) => self.list_tables()?,
            ("\\streams", []) => self.print(&crate::streams::streams_table(&self.engine))?,
            ("\\d" | ".schema", [table]) => self.describe(table)?,
            ("\\gpu", []) => {
                let inventory = GpuInventory::discover();
                let mut text = format!("{}\n{}", inventory.describe(), self.engine.backend());
                if let Some(gpu) = self.engine.gpu() {
                    let several = gpu.devices().len() > 1;
                    for (i, device) in gpu.devices().iter().enumerate() {
                        let memory = device.memory_stats();
                        let which = if several {
                            format!("device {i} (ordinal {})", device.ordinal())
                        } else {
                            "device".to_string()
                        };
                        text.push_str(&format!(
                            "\n{which} in use: {}\nGPU memory: {:.1} MiB in use, {:.1} MiB \
                             peak, {:.1} GiB budget",
                            device.description(),
                            (memory.allocated_bytes + memory.reserved_bytes) as f64 / 1048576.0,
                            memory.peak_bytes as f64 / 1048576.0,
                            memory.budget_bytes as f64 / 1073741824.0,
                        ));
                    }
                    text.push_str(&format!(
                        "\noperators left on the CPU so far: {}",
                        gpu.fallbacks()
                    ));
                }
                let cached = self.engine.cached_tables();
                if cached.is_empty() {
                    text.push_str("\ncached tables: none (CACHE TABLE name loads one)");
                }
                for t in cached {
                    text.push_str(&format!(
                        "\ncached table {}: {} rows, {:.1} MiB in {} memory",
                        t.name,
                        t.rows,
                        t.bytes as f64 / 1048576.0,
                        t.location
                    ));
                    if !t.shards.is_empty() {
                        let by = if t.sharded_by.is_empty() {
                            "round robin".to_string()
                        } else {
                            format!("by ({})", t.sharded_by.join(", "))
                        };
                        let shards: Vec<String> = t
                            .shards
                            .iter()
                            .map(|s| {
                                format!(
                                    "device {}: {} rows, {:.1} MiB",
                                    s.device,
                                    s.rows,
                                    s.bytes as f64 / 1048576.0
                                )
                            })
                            .collect();
                        text.push_str(&format!("; sharded {by}: {}", shards.join("; ")));
                    }
                }
                self.print(&text)?;
            }
            _ => {
                eprintln!("Error: unknown command '{command}'. Type \\? for help.");
                return Err(Reported);
            }
        }
        Ok(Flow::Continue)
    }

    fn list_tables(&self) -> Result<(), Reported> {
        let mut table = Table::new();
        table.load_preset(TABLE_STYLE);
        table.set_header(["table", "columns"]);
        for name in self.engine.table_names() {
            let columns = self
                .runtime
                .block_on(self.engine.table_schema(&name))
                .map(|s| s.fields().len().to_string())
                .unwrap_or_else(|e| format!("error: {e}"));
            table.add_row([name, columns]);
        }
        self.print(&table.to_string())
    }

    fn describe(&self, name: &str) -> Result<(), Reported> {
        let schema = self
            .runtime
            .block_on(self.engine.table_schema(name))
            .map_err(|e| {
                eprintln!("Error: {e}");
                Reported
            })?;
        let mut table = Table::new();
        table.load_preset(TABLE_STYLE);
        table.set_header(["column", "type", "nullable"]);
        for field in schema.fields() {
            let nullable = if field.is_nullable() { "YES" } else { "NO" };
            table.add_row([
                field.name().clone(),
                field.data_type().to_string(),
                nullable.into(),
            ]);
        }
        self.print(&table.to_string())
    }

    fn print(&self, text: &str) -> Result<(), Reported> {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{text}").map_err(|e| {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                eprintln!("Error: cannot write to standard output: {e}");
            }
            Reported
        })
    }

    fn refresh_completions(&self) {
        let mut names = Vec::new();
        for table in self.engine.table_names() {
            if let Ok(schema) = self.runtime.block_on(self.engine.table_schema(&table)) {
                names.extend(schema.fields().iter().map(|f| f.name().clone()));
            }
            names.push(table);
        }
        names.sort();
        names.dedup();
        if let Ok(mut shared) = self.completions.lock() {
            *shared = names;
        }
    }
}

enum RunError {
    Engine(SpateError),
    Output(String),
    /// Standard output was closed (e.g. piped into `head`): stop quietly.
    Closed,
    Cancelled,
    /// The statement panicked; the panic hook printed the report.
    Panicked,
}

impl From<SpateError> for RunError {
    fn from(err: SpateError) -> Self {
        RunError::Engine(err)
    }
}

fn output_error(err: std::io::Error) -> RunError {
    if err.kind() == std::io::ErrorKind::BrokenPipe {
        RunError::Closed
    } else {
        RunError::Output(err.to_string())
    }
}

fn usage_error(command: &str, usage: &str) -> Result<Flow, Reported> {
    eprintln!("Error: bad arguments in '{command}'; usage: {usage}");
    Err(Reported)
}

/// Prints an engine error with the statement line and a caret under the reported position.
fn report(err: &SpateError, text: &str, line_offset: u64, column_offset: u64, origin: &Origin) {
    eprintln!("Error: {err}");
    let Some(location) = err.location() else {
        return;
    };
    let Some(source_line) = text.lines().nth(location.line.saturating_sub(1) as usize) else {
        return;
    };
    let line = location.line + line_offset;
    let column = if location.line == 1 {
        location.column + column_offset
    } else {
        location.column
    };
    match origin {
        Origin::File(path) => eprintln!("  --> {path}:{line}:{column}"),
        Origin::Inline => eprintln!("  --> line {line}, column {column}"),
    }
    let caret_at = location.column.saturating_sub(1) as usize;
    let pad: String = source_line
        .chars()
        .take(caret_at)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    eprintln!("   | {source_line}");
    eprintln!("   | {pad}^");
}

/// The border style of arrow's result tables, so that listings look like results.
pub(crate) const TABLE_STYLE: &str = "||--+-++|    ++++++";

const HELP: &str = r"Statements end with ';' and may span lines.

  \d              list tables                (.tables)
  \d NAME         describe a table           (.schema NAME)
  \timing [on|off]  show elapsed time after each statement (.timer)
  \gpu            show GPUs, the backend in use and the cached tables
  \streams        show streams: watermark, lag, late rows, views
  SUBSCRIBE VIEW  print what a continuous view emits, until Ctrl-C
  \?              this help                  (.help)
  \q              quit                       (.quit, Ctrl-D)

CACHE TABLE name loads a table into GPU memory (host memory on the cpu backend)
for later queries; UNCACHE TABLE name frees it.
Ctrl-C cancels a running query. Run 'spate --help' for command-line options.";
