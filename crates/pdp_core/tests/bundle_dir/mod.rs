//! Test-only reading of a bundle directory into the texts [`Bundle::from_sources`] takes, for
//! this crate's tests and benches (`#[path]`-included by the benches).
//!
//! The decision core reads no files: the server's reader (`pdp_server::bundle_dir`,
//! docs/bundles.md) is the one of record, and this crate must not depend on the server, so its
//! tests carry this small copy of the layout rules: `*.cedar` policy files in file-name order,
//! at most one schema file (`*.cedarschema`, `*.cedarschema.json` or `schema.json`),
//! `entities.json` and `linked`; every other file is ignored.

use pdp_core::{Bundle, BundleError, BundleSources, SourceError};
use std::path::Path;

/// Loads the bundle in directory `dir`: its files read as the module docs say, then
/// [`Bundle::from_sources`].
///
/// # Errors
/// [`BundleError`] naming the directory or file when one cannot be read, when the directory
/// holds no policy file or more than one schema file, and every error of
/// [`Bundle::from_sources`].
pub fn load(dir: &Path) -> Result<Bundle, BundleError> {
    let fail = |file: &str, message: String| BundleError::one(SourceError::file(file, message));
    let dir_name = dir.display().to_string();
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| fail(&dir_name, format!("cannot read bundle directory: {e}")))?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let mut src = BundleSources::default();
    for name in names {
        let is_schema = name.ends_with(".cedarschema")
            || name.ends_with(".cedarschema.json")
            || name == "schema.json";
        let wanted = name.ends_with(".cedar") || is_schema || name == "entities.json";
        if !wanted && name != "linked" {
            continue;
        }
        let text = std::fs::read_to_string(dir.join(&name))
            .map_err(|e| fail(&name, format!("cannot read file: {e}")))?;
        if name.ends_with(".cedar") {
            src.policies.push((name, text));
        } else if is_schema {
            if let Some((first, _)) = &src.schema {
                let both = format!("more than one schema file: `{first}`, `{name}`");
                return Err(fail(&dir_name, both));
            }
            src.schema = Some((name, text));
        } else if name == "entities.json" {
            src.entities = Some((name, text));
        } else {
            src.links = Some((name, text));
        }
    }
    if src.policies.is_empty() {
        return Err(fail(&dir_name, "no `*.cedar` policy file".to_owned()));
    }
    Bundle::from_sources(&src)
}
