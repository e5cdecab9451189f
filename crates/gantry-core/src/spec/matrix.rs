//! Job arrays: a `matrix` expanded into one job per combination.

#[allow(unused_imports)]
use super::*;

/// Expand a job array (`matrix`) into one job per combination; a job without `matrix` is returned as is.
pub fn expand(job: &ValidJob) -> Vec<ValidJob> {
    if job.spec.matrix.is_empty() {
        // A job run again is on its own, whatever matrix it once came from.
        return vec![ValidJob {
            matrix_part: None,
            ..job.clone()
        }];
    }
    let mut combos: Vec<Vec<(String, String)>> = vec![vec![]];
    for (k, vals) in &job.spec.matrix {
        combos = combos
            .into_iter()
            .flat_map(|c| {
                vals.iter().map(move |v| {
                    let mut c = c.clone();
                    c.push((k.clone(), v.to_string()));
                    c
                })
            })
            .collect();
    }
    let group = {
        use std::hash::{Hash, Hasher};
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            std::time::SystemTime::now(),
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            &job.name,
        )
            .hash(&mut h);
        format!("{:016x}", h.finish())
    };
    let count = combos.len() as u32;
    combos
        .into_iter()
        .enumerate()
        .map(|(index, c)| {
            let mut j = job.clone();
            j.matrix_part = Some(MatrixPart {
                group: group.clone(),
                index: index as u32,
                count,
                params: c.iter().cloned().collect(),
            });
            j.spec.matrix.clear();
            let subst = |s: &str| {
                c.iter()
                    .fold(s.to_string(), |acc, (k, v)| acc.replace(&format!("{{{k}}}"), v))
            };
            j.spec.command = job.spec.command.as_ref().map(|cmd| cmd.map(subst));
            for (k, v) in &c {
                j.spec.env.insert(k.to_ascii_uppercase(), v.clone());
            }
            let shown = |v: &str| {
                v.chars()
                    .map(|ch| {
                        if unprintable(ch) {
                            ch.escape_unicode().to_string()
                        } else {
                            ch.to_string()
                        }
                    })
                    .collect::<String>()
            };
            j.name = format!(
                "{}[{}]",
                job.name,
                c.iter()
                    .map(|(k, v)| format!("{k}={}", shown(v)))
                    .collect::<Vec<_>>()
                    .join(",")
            );
            // A long matrix value stays in the command and environment, not in everyone's queue.
            if j.name.chars().count() > MAX_NAME_CHARS {
                j.name = j.name.chars().take(MAX_NAME_CHARS - 2).chain("…]".chars()).collect();
            }
            j.spec.name = Some(j.name.clone());
            j
        })
        .collect()
}
