//! Code generated from proto/svc/authz/v1/authz.proto by build.rs (tonic-build): the gRPC
//! messages and the `svc.authz.v1` services' server traits, and the encoded file descriptor
//! set reflection serves. The bottom of the crate's modules: it uses none of them.
#![allow(clippy::all, clippy::pedantic, missing_docs)]

tonic::include_proto!("svc.authz.v1");
/// The encoded file descriptor set served by reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("authz_descriptor");
