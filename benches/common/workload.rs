//! The request the benches claim: one tenant and operation, a key, a payload derived from the
//! key (the same key always comes with the same payload) and a small created-resource answer.

use idem::{Request, Response, Scope};

/// The scope's tenant.
pub const TENANT: &str = "tenant-0042";
/// The scope's operation.
pub const OPERATION: &str = "create_order";

/// The request's canonical payload for `key`.
pub fn payload(key: &str) -> Vec<u8> {
    format!("sku=sku-1&qty=2&ref={key}").into_bytes()
}

/// The request for `key` in `TENANT`/`OPERATION`, fingerprinted over `payload(key)`.
pub fn request(key: &str) -> Request {
    Request::from_canonical_bytes(Scope::new(TENANT, OPERATION), key, &payload(key))
}

/// The answer every claim records: 201, `{"ok":true}`, resource `("order", "o1")`.
pub fn response() -> Response {
    Response::new(201, r#"{"ok":true}"#).with_resource("order", "o1")
}
