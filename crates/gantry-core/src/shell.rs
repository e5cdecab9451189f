//! Quoting for `/bin/sh` (pure leaf): template substitutions into string commands, Slurm batch scripts.

/// `'…'`: one shell word, whatever `s` holds.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `s` as one shell word, quoted only when it needs to be (`/gantry/config/exp.yaml` stays as is;
/// `my run (1).yaml` becomes `'my run (1).yaml'`).
pub fn word(s: &str) -> String {
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "_./=:@%+,-".contains(c));
    if plain {
        s.to_string()
    } else {
        quote(s)
    }
}

/// Words a string command may begin with that `exec` cannot run: the shell's reserved words and
/// builtins (some images have no `/bin/echo`; `cd`, `export`, `.` only make sense in the shell).
const SHELL_WORDS: [&str; 56] = [
    "if", "then", "else", "elif", "fi", "case", "esac", "for", "while", "until", "do", "done", "{", "}", "!", "[[",
    "function", "select", "time", ".", ":", "alias", "bg", "break", "cd", "command", "continue", "echo", "eval",
    "exec", "exit", "export", "false", "fg", "getopts", "hash", "jobs", "kill", "local", "printf", "pwd", "read",
    "readonly", "return", "set", "shift", "source", "test", "[", "times", "trap", "true", "type", "ulimit", "umask",
    "unset",
];

/// What a string command is, for [`for_signals`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One simple command that `exec` can replace the shell with (`python train.py --lr 0.1 > log`,
    /// `CUDA_LAUNCH_BLOCKING=1 python x.py`): the byte offset of its command word.
    Program(usize),
    /// One simple command the shell runs itself (`echo hi`, `A=1`): the shell is the work.
    Builtin,
    /// Anything else: lists (`;`, `&&`, `||`, `&`), pipelines, subshells, command substitutions
    /// outside double quotes, several lines, here-documents, a redirection first.
    Compound,
}

/// The [`Shape`] of a string command.
pub fn shape(s: &str) -> Shape {
    let b = s.as_bytes();
    let (mut i, mut word_start) = (0, None::<usize>);
    let (mut single, mut double) = (false, false);
    let mut words: Vec<(usize, usize)> = vec![];
    while i < b.len() {
        let c = b[i];
        if single {
            single = c != b'\'';
        } else if double {
            match c {
                b'\\' => i += 1,
                b'"' => double = false,
                _ => {}
            }
        } else {
            match c {
                b'\\' => {
                    word_start.get_or_insert(i);
                    i += 1;
                }
                b'\'' => {
                    word_start.get_or_insert(i);
                    single = true;
                }
                b'"' => {
                    word_start.get_or_insert(i);
                    double = true;
                }
                b' ' | b'\t' => {
                    if let Some(w) = word_start.take() {
                        words.push((w, i));
                    }
                }
                b'#' if word_start.is_none() => break,
                // `2>&1`, `>&2`, `<&0`, `>|`: redirections, not lists or pipes.
                b'&' | b'|' if i > 0 && (b[i - 1] == b'>' || (c == b'&' && b[i - 1] == b'<')) => {
                    word_start.get_or_insert(i);
                }
                b';' | b'&' | b'|' | b'(' | b')' | b'`' | b'\n' | b'\r' => return Shape::Compound,
                b'<' if b.get(i + 1) == Some(&b'<') => return Shape::Compound,
                _ => {
                    word_start.get_or_insert(i);
                }
            }
        }
        i += 1;
    }
    if single || double {
        return Shape::Compound;
    }
    if let Some(w) = word_start {
        words.push((w, b.len().min(i)));
    }
    for (start, end) in words {
        let w = &s[start..end];
        let assignment = w
            .split_once('=')
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_'))
            && !w.as_bytes()[0].is_ascii_digit();
        if assignment {
            continue;
        }
        if w.trim_start_matches(|c: char| c.is_ascii_digit())
            .starts_with(['<', '>'])
        {
            return Shape::Compound;
        }
        if SHELL_WORDS.contains(&w) {
            return Shape::Builtin;
        }
        return Shape::Program(start);
    }
    Shape::Builtin
}

/// The signals a string command's shell waits out (see [`for_signals`]): every checkpoint signal.
pub const TRAPPED: &str = "TERM USR1 USR2 INT HUP QUIT";

/// The text `/bin/sh -c` runs for a string command so that a checkpoint signal, a timeout or a
/// cancel reaches the process doing the work, and whether Docker's init must signal the command's
/// whole process group (`TINI_KILL_PROCESS_GROUP`):
/// - one simple command is `exec`'d: the shell becomes that process, which gets the signal alone,
///   exactly as in the list form (`[python, train.py]`);
/// - one builtin (`echo hi`) runs as written: the shell is the work;
/// - anything else (`cd x && python train.py`, pipelines, several lines) runs as written, the signal
///   goes to every process of the command's process group, and the shell waits for the command it is
///   running to end before it exits with that command's status (`trap exit`), instead of dying at once
///   and taking the container down before the work saved.
pub fn for_signals(s: &str) -> (String, bool) {
    match shape(s) {
        Shape::Program(at) => (format!("{}exec {}", &s[..at], &s[at..]), false),
        Shape::Builtin => (s.to_string(), false),
        Shape::Compound => (format!("trap exit {TRAPPED}; {s}"), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_survive_the_shell() {
        for s in [
            "exp.yaml",
            "my run.yaml",
            "lr01 (1).yaml",
            "lr=0.1:bs=32.yaml",
            "it's.yaml",
            "$(reboot).yaml",
            "a\"b`c\\d.yaml",
            "",
        ] {
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg(format!("printf %s {}", word(s)))
                .output()
                .unwrap();
            assert_eq!(String::from_utf8(out.stdout).unwrap(), s);
        }
        assert_eq!(word("/gantry/config/exp.yaml"), "/gantry/config/exp.yaml");
    }

    #[test]
    fn one_simple_command_is_execd_anything_else_runs_as_written_behind_a_trap() {
        for (cmd, want) in [
            ("python train.py", "exec python train.py"),
            (
                "  python3 train.py --lr 0.1 > log 2>&1",
                "  exec python3 train.py --lr 0.1 > log 2>&1",
            ),
            (
                "CUDA_LAUNCH_BLOCKING=1 A=b python x.py",
                "CUDA_LAUNCH_BLOCKING=1 A=b exec python x.py",
            ),
            (
                "python -c 'import a; a.run()' \"x;y\" $HOME",
                "exec python -c 'import a; a.run()' \"x;y\" $HOME",
            ),
            (
                "python \"$(pwd)/x.py\" # train; then",
                "exec python \"$(pwd)/x.py\" # train; then",
            ),
        ] {
            assert_eq!(for_signals(cmd), (want.to_string(), false), "{cmd}");
        }
        for cmd in [
            "cd /work && python train.py",
            "python a.py; python b.py",
            "python a.py | tee log",
            "python a.py &",
            "line 1\nline 2",
            "python $(pwd)/x.py",
            "cat <<EOF\nx\nEOF",
            "> log python x",
            "if true; then python x; fi",
            "python 'unterminated",
        ] {
            let (text, group) = for_signals(cmd);
            assert_eq!(text, format!("trap exit {TRAPPED}; {cmd}"), "{cmd}");
            assert!(group, "{cmd}");
        }
        for cmd in ["", "echo hi", "cd x", "A=1", "  "] {
            assert_eq!(for_signals(cmd), (cmd.to_string(), false), "{cmd}");
        }
    }

    /// What the rewrite is for, with the machine's own `/bin/sh` (Debian's dash does not exec the
    /// last command itself): a signal to the shell (Docker's init forwards it to its one child) reaches
    /// the program of a one-command string, which saves and exits 0.
    #[test]
    fn a_signal_to_the_shell_of_a_one_command_string_reaches_the_program() {
        // Bounded, so that without the rewrite (the signal kills the outer shell) it ends by itself.
        let prog =
            "trap 'echo saved; exit 0' USR1; echo up; i=0; while [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done";
        let (text, _) = for_signals(&format!("sh -c {}", quote(prog)));
        let mut child = std::process::Command::new("/bin/sh")
            .arg("-c")
            .arg(&text)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "up\n");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGUSR1,
        )
        .unwrap();
        assert_eq!(child.wait().unwrap().code(), Some(0), "the program handled its signal");
        line.clear();
        std::io::BufRead::read_line(&mut out, &mut line).unwrap();
        assert_eq!(line, "saved\n");
    }
}
