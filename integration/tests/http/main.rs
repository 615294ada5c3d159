//! The `Idempotency-Key` layer (idem's `http` feature) driven in-process through tower, and the
//! async face: keys and tenants, fingerprints, started handlers, overload, heartbeats, pinned
//! formats.
//!
//! One module per behaviour, named by the sentence it proves (`cargo test --test http -- <module>::`
//! runs one); the shared helpers are modules of this binary too.

#[path = "../../../tests/common/mod.rs"]
mod common;

#[cfg(feature = "http")]
#[path = "../http_fixtures/mod.rs"]
mod http_fixtures;

mod async_face_never_blocks_the_runtime;
mod http_a_key_header_is_one_sf_string;
mod http_a_server_error_is_recorded_unless_503;
mod http_a_started_handler_runs_once;
mod http_a_tenant_header_name_never_panics;
mod http_formats_are_pinned;
mod http_heartbeats_survive_transient_failures;
mod http_hooks_bind_the_intent_not_the_bytes;
mod http_json_bodies_compare_as_json;
mod http_layer;
mod http_overload_is_answered_503_at_once;
mod http_tenant_and_key_are_checked_before_the_body;
