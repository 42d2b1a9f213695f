//! Golden files for unit tests: a test renders what it checks as text and
//! compares it with a committed file, so a change of behaviour shows as a
//! diff in review. `CONFINE_BLESS=1` rewrites the files instead of
//! comparing; without it a mismatch fails and shows the lines that differ.

use std::path::{Path, PathBuf};

/// The environment variable that rewrites golden files.
pub const BLESS: &str = "CONFINE_BLESS";

/// Compare `actual` with the golden file `dir/name` (`dir` relative to
/// the crate's root), or rewrite it under [`BLESS`].
pub fn check(dir: &str, name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir).join(name);
    let actual = if actual.ends_with('\n') { actual.to_string() } else { format!("{actual}\n") };
    if std::env::var_os(BLESS).is_some_and(|v| v == "1") {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => panic!("{}: {e}; run with {BLESS}=1 to write it", shown(&path)),
    };
    if expected != actual {
        panic!(
            "{} differs from what the test got ({BLESS}=1 rewrites it):\n{}",
            shown(&path),
            diff(&expected, &actual)
        );
    }
}

/// `path` relative to the crate's root.
fn shown(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .map(PathBuf::from)
        .unwrap_or_else(|_| path.into())
        .display()
        .to_string()
}

/// The lines that differ, `-` for `expected`'s and `+` for `actual`'s
/// (a longest common subsequence of lines), each run with a line of
/// context either side and its line number in `expected`.
fn diff(expected: &str, actual: &str) -> String {
    let a: Vec<&str> = expected.lines().collect();
    let b: Vec<&str> = actual.lines().collect();
    // common[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut common = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i][j] = if a[i] == b[j] { common[i + 1][j + 1] + 1 } else { common[i + 1][j].max(common[i][j + 1]) };
        }
    }
    // The edit script: (' ', '-' or '+', line, its number in `expected`).
    let mut script = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            script.push((' ', a[i], i));
            (i, j) = (i + 1, j + 1);
        } else if j == b.len() || (i < a.len() && common[i + 1][j] >= common[i][j + 1]) {
            script.push(('-', a[i], i));
            i += 1;
        } else {
            script.push(('+', b[j], i));
            j += 1;
        }
    }
    let changed = |k: usize| script.get(k).is_some_and(|(op, _, _)| *op != ' ');
    let mut out = String::new();
    let mut k = 0;
    while k < script.len() {
        if !changed(k) {
            k += 1;
            continue;
        }
        let from = k.saturating_sub(1);
        let mut to = k;
        while changed(to) {
            to += 1;
        }
        out.push_str(&format!("@@ line {} @@\n", script[from].2 + 1));
        for (op, line, _) in &script[from..(to + 1).min(script.len())] {
            out.push_str(&format!("{op}{line}\n"));
        }
        k = to;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_diff_shows_the_changed_lines_between_context() {
        let d = diff("a\nb\nc\nd\n", "a\nb\nx\ny\nd\n");
        assert_eq!(d, "@@ line 2 @@\n b\n-c\n+x\n+y\n d\n");
        assert_eq!(diff("a\n", "a\nb\n"), "@@ line 1 @@\n a\n+b\n");
        let d = diff("x\n1\n2\nx\n3\n", "y\n1\n2\ny\n3\n");
        assert_eq!(d, "@@ line 1 @@\n-x\n+y\n 1\n@@ line 3 @@\n 2\n-x\n+y\n 3\n");
    }
}
