//! Problem types of the service's own errors (the layer's are `urn:idem:problem:*`).

/// No route for this path.
pub const NOT_FOUND: &str = "urn:edge-service:problem:not-found";
/// The route exists, the method does not.
pub const METHOD_NOT_ALLOWED: &str = "urn:edge-service:problem:method-not-allowed";
/// No payment with this id for this tenant.
pub const NO_SUCH_PAYMENT: &str = "urn:edge-service:problem:no-such-payment";
/// The payment body is not valid JSON of the expected shape, or a field is invalid.
pub const INVALID_PAYMENT: &str = "urn:edge-service:problem:invalid-payment";
/// The amount is outside 1..=`MAX_AMOUNT`.
pub const AMOUNT_OUT_OF_RANGE: &str = "urn:edge-service:problem:amount-out-of-range";
/// The tenant's ledger total would not fit in an `i64`.
pub const LEDGER_OUT_OF_RANGE: &str = "urn:edge-service:problem:ledger-total-out-of-range";
/// `X-Tenant-Id` sent more than once, or not a tenant the layer takes (empty, over the
/// store's tenant limit, not visible ASCII, or with a comma: `idem::http::tenant_from_header`).
pub const INVALID_TENANT: &str = "urn:edge-service:problem:invalid-tenant";
/// A path parameter could not be read.
pub const INVALID_PATH: &str = "urn:edge-service:problem:invalid-path";
/// The request took longer than `--request-timeout-ms`.
pub const TIMEOUT: &str = "urn:edge-service:problem:request-timeout";
/// Reading the store failed.
pub const READ_FAILED: &str = "urn:edge-service:problem:read-failed";
/// The store stopped after an I/O failure (`GET /v1/health`): restart the service.
pub const STORE_FAILED: &str = "urn:edge-service:problem:store-failed";
