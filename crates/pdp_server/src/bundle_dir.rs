//! Reading a policy bundle from a directory on disk (docs/bundles.md): the file I/O in front of
//! [`Bundle::from_sources`], which builds a bundle from texts in memory.
//!
//! A bundle directory holds:
//!
//! * one or more `*.cedar` policy files, read in file-name order;
//! * at most one schema file, `*.cedarschema` (Cedar syntax) or `schema.json` /
//!   `*.cedarschema.json` (JSON syntax);
//! * optionally `entities.json`: Cedar's entity JSON (an array), or an entity map keyed by UID
//!   (the format of Cedar's TinyTodo example);
//! * optionally `linked`: template links in the Cedar CLI's format.
//!
//! Other files, and subdirectories, are ignored.

use pdp_core::{Bundle, BundleError, BundleSources, SourceError};
use std::path::Path;

/// Reads the texts of the bundle directory `dir` (layout in the module docs): its files sorted
/// by name, each as `(file name, contents)`.
///
/// # Errors
/// [`BundleError`] listing every problem found: the directory cannot be read, holds no policy
/// file, holds more than one schema file, or a file cannot be read or is not UTF-8 (each
/// [`SourceError`] names the file, or the directory for problems of the whole directory).
pub fn read_sources(dir: &Path) -> Result<BundleSources, BundleError> {
    let dir_name = dir.display().to_string();
    let read_dir = std::fs::read_dir(dir).map_err(|e| {
        BundleError::one(SourceError::file(
            &dir_name,
            format!("cannot read bundle directory: {e}"),
        ))
    })?;
    let mut names: Vec<String> = Vec::new();
    for entry in read_dir.flatten() {
        if entry.path().is_file() {
            names.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    names.sort();
    let mut errors = Vec::new();
    let mut out = BundleSources::default();
    let mut schemas = Vec::new();
    for name in names {
        let kind = if name.ends_with(".cedar") {
            1
        } else if name.ends_with(".cedarschema")
            || name.ends_with(".cedarschema.json")
            || name == "schema.json"
        {
            2
        } else if name == "entities.json" {
            3
        } else if name == "linked" {
            4
        } else {
            continue;
        };
        let text = match std::fs::read_to_string(dir.join(&name)) {
            Ok(t) => t,
            Err(e) => {
                errors.push(SourceError::file(&name, format!("cannot read file: {e}")));
                continue;
            }
        };
        match kind {
            1 => out.policies.push((name, text)),
            2 => schemas.push((name, text)),
            3 => out.entities = Some((name, text)),
            _ => out.links = Some((name, text)),
        }
    }
    if out.policies.is_empty() {
        errors.push(SourceError::file(
            &dir_name,
            "bundle directory holds no `*.cedar` policy file",
        ));
    }
    if schemas.len() > 1 {
        let list: Vec<String> = schemas.iter().map(|(n, _)| format!("`{n}`")).collect();
        errors.push(SourceError::file(
            &dir_name,
            format!(
                "bundle directory holds more than one schema file: {}",
                list.join(", ")
            ),
        ));
    }
    if !errors.is_empty() {
        return Err(BundleError { errors });
    }
    out.schema = schemas.pop();
    Ok(out)
}

/// Loads the bundle in directory `dir`: [`read_sources`], then [`Bundle::from_sources`]
/// (parsing, naming and strict validation, docs/bundles.md#validation).
///
/// # Errors
/// [`BundleError`] with every problem found, by [`read_sources`] or by
/// [`Bundle::from_sources`].
pub fn load(dir: &Path) -> Result<Bundle, BundleError> {
    Bundle::from_sources(&read_sources(dir)?)
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
mod tests {
    use super::*;
    use std::fs;
    use std::path::PathBuf;

    /// A fresh directory for one test, holding `files` (name, bytes).
    fn dir_with(name: &str, files: &[(&str, &[u8])]) -> PathBuf {
        let d = std::env::temp_dir().join(format!("svc-bundle-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        for (f, bytes) in files {
            fs::write(d.join(f), bytes).unwrap();
        }
        d
    }

    fn messages(e: &BundleError) -> Vec<(String, String)> {
        e.errors
            .iter()
            .map(|s| (s.file.clone(), s.message.clone()))
            .collect()
    }

    const SCHEMA: &[u8] = b"entity Human; entity Doc;
        action read appliesTo { principal: [Human], resource: [Doc] };";

    #[test]
    fn reads_the_bundle_files_in_name_order_and_ignores_the_rest() {
        let d = dir_with(
            "layout",
            &[
                ("b.cedar", b"permit (principal, action, resource);"),
                (
                    "a.cedar",
                    b"forbid (principal, action, resource) when { false };",
                ),
                ("app.cedarschema", SCHEMA),
                ("entities.json", b"[]"),
                ("linked", b"[]"),
                ("README.md", b"not part of the bundle"),
            ],
        );
        fs::create_dir_all(d.join("sub.cedar")).unwrap();
        let src = read_sources(&d).unwrap();
        let names: Vec<&str> = src.policies.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a.cedar", "b.cedar"]);
        assert_eq!(
            src.schema.as_ref().map(|(n, _)| n.as_str()),
            Some("app.cedarschema")
        );
        assert_eq!(src.entities, Some(("entities.json".into(), "[]".into())));
        assert_eq!(src.links, Some(("linked".into(), "[]".into())));
        // Policies are named in file-name order: a.cedar's first.
        let bundle = load(&d).unwrap();
        let mut policies: Vec<(String, String)> = bundle
            .policy_meta()
            .map(|m| (m.name.clone(), m.file.clone()))
            .collect();
        policies.sort();
        assert_eq!(
            policies,
            [
                ("policy0".to_owned(), "a.cedar".to_owned()),
                ("policy1".to_owned(), "b.cedar".to_owned())
            ]
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn every_problem_of_the_directory_is_reported_at_once() {
        let d = dir_with(
            "problems",
            &[
                ("a.cedarschema", SCHEMA),
                ("schema.json", b"{}"),
                ("entities.json", b"\xff\xfe not UTF-8"),
            ],
        );
        let e = read_sources(&d).unwrap_err();
        let dir_name = d.display().to_string();
        let mut found = messages(&e);
        // The text after the prefix is the operating system's, through `std::io::Error`.
        let (file, message) = found.remove(0);
        assert_eq!(file, "entities.json");
        assert!(message.starts_with("cannot read file: "), "{message}");
        assert_eq!(
            found,
            [
                (
                    dir_name.clone(),
                    "bundle directory holds no `*.cedar` policy file".to_owned()
                ),
                (
                    dir_name,
                    "bundle directory holds more than one schema file: `a.cedarschema`, \
                     `schema.json`"
                        .to_owned()
                ),
            ]
        );
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn every_cedar_example_app_loads_as_it_stands() {
        // The decision core's tests read these apps with a reader of their own (pdp_core does
        // not depend on this crate): this one must take them too.
        let root =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/testdata/cedar-examples");
        let mut apps: Vec<PathBuf> = fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        apps.sort();
        assert!(apps.len() >= 5, "{}: {apps:?}", root.display());
        for app in &apps {
            let bundle = load(app).unwrap_or_else(|e| panic!("{}: {e}", app.display()));
            assert!(bundle.policy_meta().next().is_some(), "{}", app.display());
        }
    }

    #[test]
    fn a_missing_directory_is_one_error_naming_it() {
        let d = std::env::temp_dir().join(format!("svc-bundle-missing-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        let e = load(&d).unwrap_err();
        assert_eq!(e.errors.len(), 1);
        assert_eq!(e.errors[0].file, d.display().to_string());
        assert!(
            e.errors[0]
                .message
                .starts_with("cannot read bundle directory: "),
            "{}",
            e.errors[0].message
        );
    }
}
