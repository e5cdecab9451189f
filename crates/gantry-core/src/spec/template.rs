//! Template folders: a template job instantiated for a dropped config file, and the JSON Schema.

#[allow(unused_imports)]
use super::*;

/// Template folders: a `gantry.toml`/`gantry.yaml` whose command refers to `{config}`.
pub const TEMPLATE_NAMES: &[&str] = &["gantry.toml", "gantry.yaml", "gantry.yml"];
/// Where a template job sees its config file.
pub const TEMPLATE_CONFIG_DIR: &str = "/gantry/config";

/// Check a template: it must be a valid spec whose command uses `{config}`.
pub fn parse_template(text: &str, format: Format) -> Result<JobSpec, SpecError> {
    let spec = parse(text, format)?;
    match &spec.command {
        Some(c) if c.mentions("{config}") => Ok(spec),
        _ => Err(SpecError::new(
            "the template's `command` does not mention `{config}`",
            "write e.g. `command = \"python tools/train.py -c {config}\"`",
        )
        .at_key(text, "command")),
    }
}

/// A template's job for one dropped config file, and that file's mount.
#[derive(Debug, Clone)]
pub struct Instance {
    pub spec: JobSpec,
    /// Structured, not a `host:container` string: a file may be named `lr=0.1:bs=32.yaml`.
    pub config: Mount,
}

/// Instantiate a template for one dropped config file at `host_path` (its final, accepted location).
/// `{config}` becomes the path the job sees; in a string command it is one shell word (quoted when
/// the file's name needs it: `my run (1).yaml`).
pub fn instantiate_template(template: &JobSpec, template_dir_name: &str, host_path: &str, file_name: &str) -> Instance {
    let inside = format!("{TEMPLATE_CONFIG_DIR}/{file_name}");
    let mut spec = template.clone();
    spec.command = template.command.as_ref().map(|c| match c {
        Command::Shell(s) => Command::Shell(s.replace("{config}", &crate::shell::word(&inside))),
        Command::Exec(v) => Command::Exec(v.iter().map(|a| a.replace("{config}", &inside)).collect()),
    });
    let stem = file_name.rsplit_once('.').map(|(a, _)| a).unwrap_or(file_name);
    spec.name = Some(format!(
        "{}:{stem}",
        template.name.clone().unwrap_or_else(|| template_dir_name.to_string())
    ));
    Instance {
        spec,
        config: Mount {
            host: host_path.to_string(),
            container: inside,
            read_only: true,
        },
    }
}
