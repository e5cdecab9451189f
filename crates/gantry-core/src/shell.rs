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
}
