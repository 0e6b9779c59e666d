//! Splits shell input into backslash commands and SQL statements.
//!
//! Contract: a statement ends at a `;` outside quotes and comments; a command is a line that
//! starts (after whitespace, at a statement boundary) with `\` or with `.` and a letter. Text
//! after the last `;` is returned as an unterminated statement so the shell can keep reading.

/// One piece of input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// A shell command such as `\d lineitem`, without surrounding whitespace.
    Command(String),
    /// One SQL statement, without its terminating `;`.
    Sql {
        /// The statement text.
        text: String,
        /// 0-based line in the input where the text starts.
        line_offset: u64,
        /// 0-based column of its first character on that line.
        column_offset: u64,
    },
}

/// The result of splitting input.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    /// Complete items, in input order.
    pub items: Vec<Item>,
    /// Non-blank text after the last complete statement (missing its `;`), with its start
    /// line and column.
    pub rest: Option<(String, u64, u64)>,
}

#[derive(Clone, Copy, PartialEq)]
enum State {
    Code,
    SingleQuote,
    DoubleQuote,
    LineComment,
    BlockComment(u32),
}

/// Splits `input`; see the module contract.
pub fn split(input: &str) -> Split {
    let chars: Vec<char> = input.chars().collect();
    let mut out = Split::default();
    let mut i = 0;
    let (mut line, mut column) = (0u64, 0u64);
    // Start of the current statement: index, line, column; None while between statements.
    let mut start: Option<(usize, u64, u64)> = None;
    let mut state = State::Code;

    let advance = |c: char, line: &mut u64, column: &mut u64| {
        if c == '\n' {
            *line += 1;
            *column = 0;
        } else {
            *column += 1;
        }
    };

    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if start.is_none() {
            if c.is_whitespace() {
                advance(c, &mut line, &mut column);
                i += 1;
                continue;
            }
            let is_command =
                c == '\\' || (c == '.' && next.is_some_and(|n| n.is_ascii_alphabetic()));
            if is_command {
                let end = chars[i..]
                    .iter()
                    .position(|&c| c == '\n')
                    .map_or(chars.len(), |p| i + p);
                let text: String = chars[i..end].iter().collect();
                out.items.push(Item::Command(text.trim().to_string()));
                for &c in &chars[i..end] {
                    advance(c, &mut line, &mut column);
                }
                i = end;
                continue;
            }
            start = Some((i, line, column));
        }
        match state {
            State::Code => match (c, next) {
                ('\'', _) => state = State::SingleQuote,
                ('"', _) => state = State::DoubleQuote,
                ('-', Some('-')) => state = State::LineComment,
                ('/', Some('*')) => {
                    state = State::BlockComment(1);
                    advance(c, &mut line, &mut column);
                    i += 1;
                }
                (';', _) => {
                    if let Some((s, l, col)) = start.take() {
                        let text: String = chars[s..i].iter().collect();
                        if !is_blank_sql(&text) {
                            out.items.push(Item::Sql {
                                text,
                                line_offset: l,
                                column_offset: col,
                            });
                        }
                    }
                }
                _ => {}
            },
            State::SingleQuote if c == '\'' => state = State::Code,
            State::DoubleQuote if c == '"' => state = State::Code,
            State::LineComment if c == '\n' => state = State::Code,
            State::BlockComment(depth) => match (c, next) {
                ('*', Some('/')) => {
                    state = if depth == 1 {
                        State::Code
                    } else {
                        State::BlockComment(depth - 1)
                    };
                    advance(c, &mut line, &mut column);
                    i += 1;
                }
                ('/', Some('*')) => {
                    state = State::BlockComment(depth + 1);
                    advance(c, &mut line, &mut column);
                    i += 1;
                }
                _ => {}
            },
            _ => {}
        }
        // Advance over the character at `i` (the second of a two-character token was consumed
        // above).
        if i < chars.len() {
            advance(chars[i], &mut line, &mut column);
        }
        i += 1;
    }
    if let Some((s, l, col)) = start {
        let text: String = chars[s..].iter().collect();
        if !is_blank_sql(&text) {
            out.rest = Some((text, l, col));
        }
    }
    out
}

/// True when `text` holds only whitespace and comments.
fn is_blank_sql(text: &str) -> bool {
    let mut rest = text.trim_start();
    loop {
        if let Some(after) = rest.strip_prefix("--") {
            rest = after.split_once('\n').map_or("", |(_, r)| r).trim_start();
        } else if let Some(after) = rest.strip_prefix("/*") {
            match after.find("*/") {
                Some(end) => rest = after[end + 2..].trim_start(),
                None => return false,
            }
        } else {
            return rest.is_empty();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(text: &str, line: u64, column: u64) -> Item {
        Item::Sql {
            text: text.to_string(),
            line_offset: line,
            column_offset: column,
        }
    }

    #[test]
    fn statements_and_commands() {
        let s = split("select 1;\n\\d t\n  select 'a;b'; .tables\nselect 2");
        assert_eq!(
            s.items,
            vec![
                sql("select 1", 0, 0),
                Item::Command("\\d t".into()),
                sql("select 'a;b'", 2, 2),
                Item::Command(".tables".into()),
            ]
        );
        assert_eq!(s.rest, Some(("select 2".into(), 3, 0)));
    }

    #[test]
    fn semicolons_in_comments_and_identifiers_do_not_split() {
        let s = split("select /* ; /* ; */ */ \"a;\" -- ;\n from t;");
        assert_eq!(s.items.len(), 1);
        assert!(s.rest.is_none());
    }

    #[test]
    fn blank_pieces_are_dropped() {
        let s = split(" ; -- only a comment\n;  /* c */ ");
        assert!(s.items.is_empty());
        assert!(s.rest.is_none());
        assert_eq!(split("").items, vec![]);
    }

    #[test]
    fn unterminated_quotes_stay_pending() {
        let s = split("select 'abc;");
        assert!(s.items.is_empty());
        assert!(s.rest.is_some());
    }

    #[test]
    fn decimals_are_not_commands() {
        let s = split(".5;");
        assert_eq!(s.items, vec![sql(".5", 0, 0)]);
    }
}
