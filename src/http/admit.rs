//! Admission of a covered request: its key, tenant and operation, checked against the layer's
//! configuration and the store's limits before the body is read, then the body within the
//! layer's limit.

use axum::body::Body;
use axum::extract::MatchedPath;
use bytes::Bytes;
use http::StatusCode;
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http_body_util::{BodyExt, Limited};

use super::answers::{invalid_tenant, misconfigured, problem_response};
use super::key::{KeyError, parse_key};
use super::layer::{Config, TenantSource};
use super::problem;
use super::tenant::{check_tenant_len, tenant_from_header};
use crate::backend::Backend;

/// The key of a covered request (`Ok(None)`: no key field at all).
pub(super) fn key_of<B: Backend>(
    config: &Config<B>,
    parts: &Parts,
) -> Result<Option<String>, KeyError> {
    let mut lines = parts.headers.get_all(&config.key_header).iter();
    let Some(first) = lines.next() else {
        return Ok(None);
    };
    match lines.count() {
        0 => parse_key(first.as_bytes(), config.store.limits().max_key_len).map(Some),
        more => Err(KeyError::Lines(more + 1)),
    }
}

/// Why a covered request has no usable tenant.
pub(super) enum TenantError {
    /// The extractor found none, or there is no tenant header: `400` missing tenant.
    Missing,
    /// `400` invalid tenant, with this detail.
    Invalid(String),
    /// `500`: the layer's tenant header name is no header name.
    Misconfigured(String),
}

impl TenantError {
    pub(super) fn response(&self) -> http::Response<Body> {
        match self {
            TenantError::Missing => problem_response(
                StatusCode::BAD_REQUEST,
                problem::MISSING_TENANT,
                "Tenant required",
                "the request names no tenant; idempotency keys are scoped per tenant",
            ),
            TenantError::Invalid(detail) => invalid_tenant(detail),
            TenantError::Misconfigured(name) => misconfigured(name),
        }
    }
}

/// The tenant of a covered request.
pub(super) fn tenant_of<B: Backend>(
    config: &Config<B>,
    parts: &Parts,
) -> Result<String, TenantError> {
    let max = config.store.limits().max_tenant_len;
    match &config.tenant {
        TenantSource::Extract(f) => {
            let tenant = f(parts).ok_or(TenantError::Missing)?;
            check_tenant_len(&tenant, max).map_err(|e| TenantError::Invalid(e.to_string()))?;
            Ok(tenant)
        }
        TenantSource::Header(name) => match tenant_from_header(&parts.headers, name, max) {
            Ok(Some(tenant)) => Ok(tenant),
            Ok(None) => Err(TenantError::Missing),
            Err(e) => Err(TenantError::Invalid(format!("{name}: {e}"))),
        },
        TenantSource::BadHeaderName(name) => Err(TenantError::Misconfigured(name.clone())),
    }
}

/// `"{METHOD} {route template}"`, and whether the request path stood in for an unknown
/// template (then the client chose the operation's length).
pub(super) fn default_operation(parts: &Parts) -> (String, bool) {
    match parts.extensions.get::<MatchedPath>() {
        Some(route) => (format!("{} {}", parts.method, route.as_str()), false),
        None => (format!("{} {}", parts.method, parts.uri.path()), true),
    }
}

pub(super) async fn read_body<B>(
    parts: &Parts,
    body: B,
    limit: usize,
) -> Result<Bytes, http::Response<Body>>
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<crate::error::BoxError>,
{
    let too_large = || {
        problem_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            problem::BODY_TOO_LARGE,
            "Request body too large",
            &format!("the request body is over the limit of {limit} bytes"),
        )
    };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(problem_response(
            StatusCode::BAD_REQUEST,
            problem::UNREADABLE_BODY,
            "Unreadable request body",
            &format!("the request body could not be read: {e}"),
        )),
    }
}
