//! The interactive shell: line editing, history, multi-line statements and completion.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use datafusion::sql::sqlparser::keywords::ALL_KEYWORDS;
use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::history::DefaultHistory;
use rustyline::validate::{ValidationContext, ValidationResult, Validator};
use rustyline::{Config, Context, Editor, Helper, Highlighter, Hinter};

use spate::Engine;

use crate::script;
use crate::session::{Flow, Origin, Session};

/// Commands offered by completion.
const COMMANDS: [&str; 12] = [
    "\\d", "\\timing", "\\gpu", "\\?", "\\q", "\\help", ".tables", ".schema", ".timer", ".help",
    ".quit", "\\quit",
];

#[derive(Helper, Hinter, Highlighter)]
struct ShellHelper {
    names: Arc<Mutex<Vec<String>>>,
}

impl Completer for ShellHelper {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        let before = &line[..pos];
        let start = before
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == '\\' || *c == '.'))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let word = &before[start..];
        Ok((start, candidates(word, &self.names)))
    }
}

/// Keywords, commands, tables and columns that start with `word`, ignoring case. Keywords
/// follow the case the user is typing in.
fn candidates(word: &str, names: &Mutex<Vec<String>>) -> Vec<Pair> {
    if word.is_empty() {
        return Vec::new();
    }
    let lower = word.to_ascii_lowercase();
    let pair = |s: String| Pair {
        display: s.clone(),
        replacement: s,
    };
    if word.starts_with('\\') || word.starts_with('.') {
        return COMMANDS
            .iter()
            .filter(|c| c.starts_with(word))
            .map(|c| pair(c.to_string()))
            .collect();
    }
    let mut out: Vec<Pair> = names
        .lock()
        .map(|n| n.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.to_ascii_lowercase().starts_with(&lower))
        .map(pair)
        .collect();
    let upper = word.chars().all(|c| !c.is_ascii_lowercase());
    out.extend(
        ALL_KEYWORDS
            .iter()
            .filter(|k| k.to_ascii_lowercase().starts_with(&lower))
            .map(|k| {
                pair(if upper {
                    k.to_string()
                } else {
                    k.to_ascii_lowercase()
                })
            }),
    );
    out
}

impl Validator for ShellHelper {
    fn validate(&self, ctx: &mut ValidationContext) -> rustyline::Result<ValidationResult> {
        // A statement runs once it ends with ';'; commands run at the end of their line.
        Ok(if script::split(ctx.input()).rest.is_some() {
            ValidationResult::Incomplete
        } else {
            ValidationResult::Valid(None)
        })
    }
}

/// Where history is kept: `$SPATE_HISTORY`, else `~/.spate_history`.
fn history_path() -> Option<PathBuf> {
    match std::env::var_os("SPATE_HISTORY") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => dirs::home_dir().map(|home| home.join(".spate_history")),
    }
}

/// Runs the interactive loop until `\q` or end of input.
pub fn run(session: &mut Session) -> rustyline::Result<()> {
    let config = Config::builder().auto_add_history(false).build();
    let mut editor: Editor<ShellHelper, DefaultHistory> = Editor::with_config(config)?;
    editor.set_helper(Some(ShellHelper {
        names: session.completions(),
    }));
    let history = history_path();
    if let Some(path) = &history {
        // A missing history file is normal on first start.
        let _ = editor.load_history(path);
    }
    let mut history_warned = false;
    loop {
        match editor.readline("spate> ") {
            Ok(line) => {
                if line.trim().is_empty() {
                    continue;
                }
                editor.add_history_entry(line.as_str())?;
                if let Some(path) = &history
                    && let Err(e) = editor.save_history(path)
                    && !history_warned
                {
                    eprintln!("warning: cannot save history to {}: {e}", path.display());
                    history_warned = true;
                }
                // Errors were printed already; the shell carries on.
                if let Ok(Flow::Quit) = session.run(&line, &Origin::Inline) {
                    break;
                }
            }
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The greeting printed when the interactive shell starts: version and backend in use.
pub fn banner(engine: &Engine) -> String {
    format!(
        "Spate {} — {}\nType \\? for help, \\q to quit. Statements end with ';'.",
        env!("CARGO_PKG_VERSION"),
        engine.backend()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Mutex<Vec<String>> {
        Mutex::new(vec![
            "lineitem".into(),
            "l_orderkey".into(),
            "nation".into(),
        ])
    }

    fn replacements(word: &str) -> Vec<String> {
        candidates(word, &names())
            .into_iter()
            .map(|p| p.replacement)
            .collect()
    }

    #[test]
    fn completes_tables_columns_keywords_and_commands() {
        let got = replacements("li");
        assert!(got.contains(&"lineitem".to_string()), "{got:?}");
        assert!(got.contains(&"limit".to_string()), "{got:?}");
        assert!(replacements("SEL").contains(&"SELECT".to_string()));
        assert!(replacements("l_").contains(&"l_orderkey".to_string()));
        assert_eq!(replacements("\\ti"), vec!["\\timing".to_string()]);
        assert!(replacements("").is_empty());
    }
}
