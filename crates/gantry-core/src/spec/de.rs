//! Hand-written deserializers for the spec's either-or fields (`command`, `after` items, `matrix`
//! values). serde's untagged enums buffer the value and, when nothing matches, say "data did not match
//! any variant of untagged enum …" at line 1, column 1; these say what the value is, which item, and
//! how to write it, at the value's own position. They accept exactly what the types serialize to, so
//! stored jobs read back unchanged.

use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::{Command, IdOrName, Scalar};

/// What one YAML/TOML/JSON value is, as far as the spec's messages need to know.
enum Value {
    Str(String),
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Null,
    List,
    Map,
}

impl Value {
    /// "the boolean true", "a list", … for messages.
    fn describe(&self) -> String {
        match self {
            Value::Str(s) => format!("the text {s:?}"),
            Value::Bool(b) => format!("the boolean {b}"),
            Value::Int(i) => format!("the number {i}"),
            Value::UInt(u) => format!("the number {u}"),
            Value::Float(x) => format!("the number {x}"),
            Value::Null => "empty (null)".into(),
            Value::List => "a list".into(),
            Value::Map => "a map".into(),
        }
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Str(v.to_string()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Str(v))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map_or(Value::UInt(v), Value::Int))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Value::List)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Value::Map)
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

impl<'de> Deserialize<'de> for Command {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Command, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Command;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a command: a string (run by /bin/sh -c) or a list of program and arguments")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Command, E> {
                Ok(Command::Shell(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Command, E> {
                Ok(Command::Shell(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Command, A::Error> {
                let mut argv = vec![];
                while let Some(v) = seq.next_element::<Value>()? {
                    let n = argv.len() + 1;
                    argv.push(match v {
                        Value::Str(s) => s,
                        // YAML reads `true`, `no`, `42` as booleans and numbers; their text is what was meant.
                        Value::Bool(b) => b.to_string(),
                        Value::Int(i) => i.to_string(),
                        Value::UInt(u) => u.to_string(),
                        // A float's text is not kept (`1.0` reads as 1): the user must say which text they mean.
                        other => {
                            return Err(de::Error::custom(format!(
                            "`command` item {n} is {}: each item is one argument, written as text (quote it: \"…\")",
                            other.describe()
                        )))
                        }
                    });
                }
                Ok(Command::Exec(argv))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Command, E> {
                Err(E::custom(format!(
                    "`command` is the boolean {v}: write the command as text (quote it: \"{v}\") or as a list"
                )))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Command, E> {
                Err(E::custom(format!(
                    "`command` is the number {v}: write the command as text (quote it) or as a list"
                )))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Command, E> {
                Err(E::custom(format!(
                    "`command` is the number {v}: write the command as text (quote it) or as a list"
                )))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Command, E> {
                Err(E::custom(format!(
                    "`command` is the number {v}: write the command as text (quote it) or as a list"
                )))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Command, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Err(de::Error::custom(
                    "`command` is a map: write it as text (`python train.py`) or a list (`[python, train.py]`)",
                ))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for IdOrName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<IdOrName, D::Error> {
        match Value::deserialize(d)? {
            Value::Int(i) => Ok(IdOrName::Id(i)),
            Value::Str(s) => Ok(IdOrName::Name(s)),
            other => Err(de::Error::custom(format!(
                "an `after` item is {}: write a job id (`12`) or the name of one of your jobs (`prep`)",
                other.describe()
            ))),
        }
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scalar, D::Error> {
        match Value::deserialize(d)? {
            Value::Int(i) => Ok(Scalar::Int(i)),
            Value::Float(x) => Ok(Scalar::Float(x)),
            Value::Bool(b) => Ok(Scalar::Bool(b)),
            Value::Str(s) => Ok(Scalar::Str(s)),
            other => Err(de::Error::custom(format!(
                "a `matrix` value is {}: each value is text, a number or a boolean (`lr: [0.1, 0.01]`)",
                other.describe()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{parse, Format};

    fn err(yaml: &str) -> String {
        parse(yaml, Format::Yaml).unwrap_err().to_string()
    }

    #[test]
    fn either_or_fields_say_what_is_wrong_and_where_never_serdes_internals() {
        let e = err("image: a\ncommand: [python, 0.5]\n");
        assert!(e.contains("`command` item 2 is the number 0.5"), "{e}");
        assert!(e.contains("line 2"), "at the command, not line 1: {e}");
        let e = err("image: a\ncommand: {run: x}\n");
        assert!(e.contains("`command` is a map"), "{e}");
        let e = err("image: a\nafter: [[1]]\n");
        assert!(e.contains("an `after` item is a list"), "{e}");
        let e = err("image: a\nmatrix: {lr: [{a: 1}]}\n");
        assert!(e.contains("a `matrix` value is a map"), "{e}");
        for bad in [
            "image: a\ncommand: [python, 0.5]\n",
            "image: a\nafter: [true]\n",
            "image: a\nmatrix: {lr: [null]}\n",
            "image: a\ncommand: 5\n",
        ] {
            assert!(!err(bad).contains("untagged"), "{}", err(bad));
        }
    }

    #[test]
    fn yaml_scalars_in_a_command_list_are_their_text() {
        let s = parse("image: a\ncommand: [true]\n", Format::Yaml).unwrap();
        assert_eq!(s.command.unwrap().argv(), vec!["true"]);
        let s = parse("image: a\ncommand: [sleep, 30, --verbose, yes]\n", Format::Yaml).unwrap();
        assert_eq!(s.command.unwrap().argv(), vec!["sleep", "30", "--verbose", "yes"]);
        let s = parse("image = \"a\"\ncommand = [\"sleep\", 3]\n", Format::Toml).unwrap();
        assert_eq!(s.command.unwrap().argv(), vec!["sleep", "3"]);
    }

    #[test]
    fn stored_jobs_read_back_unchanged() {
        for yaml in [
            "image: a\ncommand: echo hi\nafter: [3, prep]\nmatrix: {lr: [0.1, 1], x: [true, s]}\n",
            "image: a\ncommand: [echo, hi]\n",
        ] {
            let s = parse(yaml, Format::Yaml).unwrap();
            let back: super::super::JobSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
            assert_eq!(back, s);
        }
    }

    /// A billion-laughs spec: each level repeats the one before ten times (10^8 strings if expanded),
    /// all inside `command`. The either-or fields no longer buffer what they read (serde's untagged
    /// enums did, so the whole expansion was built in memory): it is refused at its first item.
    #[test]
    fn an_alias_bomb_is_refused_without_being_expanded() {
        for field in ["command", "after"] {
            let mut s = format!("image: a\n{field}:\n  - &a0 [\"{}\"]\n", "x".repeat(100));
            for i in 1..9 {
                s += &format!("  - &a{i} [{}]\n", vec![format!("*a{}", i - 1); 10].join(","));
            }
            s += "  - *a8\n";
            let e = parse(&s, Format::Yaml).unwrap_err().to_string();
            assert!(e.contains("is a list"), "{field}: {e}");
        }
    }
}
