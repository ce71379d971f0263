//! Compiles `proto/svc/authz/v1/authz.proto` (the one source of the decision point's gRPC API)
//! into Rust with tonic-build, plus the encoded file descriptor set that gRPC server reflection
//! serves. `protoc` comes from the `protoc-bin-vendored` crate unless `PROTOC` names another.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest.join("../../proto");
    let proto = proto_root.join("svc/authz/v1/authz.proto");
    if std::env::var_os("PROTOC").is_none() {
        // SAFETY of intent: build scripts are single-threaded; this only steers prost-build.
        std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    }
    let wkt = protoc_bin_vendored::include_path()?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .build_client(false)
        .file_descriptor_set_path(out.join("authz_descriptor.bin"))
        .compile_protos(&[proto.as_path()], &[proto_root.as_path(), wkt.as_path()])?;
    println!("cargo:rerun-if-changed={}", proto.display());
    Ok(())
}
