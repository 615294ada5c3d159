/// 400: a covered request without the key (unless [`super::MissingKey::PassThrough`]).
pub const MISSING_KEY: &str = "urn:idem:problem:missing-idempotency-key";
/// 400: the key field is not exactly one well-formed key (two field lines, a list,
/// parameters, a bad character or quote), or it is empty or over the store's key limit.
pub const INVALID_KEY: &str = "urn:idem:problem:invalid-idempotency-key";
/// 400: the tenant extractor found no tenant.
pub const MISSING_TENANT: &str = "urn:idem:problem:missing-tenant";
/// 400: the tenant is empty, over the store's tenant limit, or (from a tenant header) not
/// exactly one field line of visible ASCII without commas.
pub const INVALID_TENANT: &str = "urn:idem:problem:invalid-tenant";
/// 500: the operation (`"{METHOD} {route template}"` or the `.operation(...)` override) is
/// empty or over the store's operation limit: a configuration error of the service. (400
/// when no route template is known and the request path stood in for it.)
pub const INVALID_OPERATION: &str = "urn:idem:problem:invalid-operation";
/// 400: the request body could not be read.
pub const UNREADABLE_BODY: &str = "urn:idem:problem:unreadable-body";
/// 413: the request body is over the layer's body limit.
pub const BODY_TOO_LARGE: &str = "urn:idem:problem:body-too-large";
/// 409 + `Retry-After`: another request with this key is being processed.
pub const IN_FLIGHT: &str = "urn:idem:problem:request-in-flight";
/// 422: the key was used before with a different request.
pub const KEY_REUSED: &str = "urn:idem:problem:key-reused-with-different-request";
/// 503 + `Retry-After`: the layer's in-flight limit is reached, the store is saturated, or
/// the handler asked for a retry. Nothing ran or nothing was recorded.
pub const RETRY: &str = "urn:idem:problem:retry-later";
/// 500: the layer was built with a configuration it cannot use (a
/// [`super::IdempotencyLayer::tenant_header`] name that is not a valid header name); every
/// covered request gets this answer and nothing runs, until the service is fixed.
pub const MISCONFIGURED: &str = "urn:idem:problem:layer-misconfigured";
/// 500: the store failed; the outcome of this request may be unknown: retry with the key.
pub const STORE_FAILED: &str = "urn:idem:problem:store-failed";
/// 500: the handler failed after it started (it panicked, its response body failed, or
/// the inner service returned an error). Recorded as a terminal failure and replayed: the
/// key does not run the handler again.
pub const HANDLER_FAILED: &str = "urn:idem:problem:handler-failed";
