//! Scopes, requests, limits and the composite record key.

use crate::error::{Error, Field};
use crate::model::keys::Fingerprint;

/// Where an idempotency key lives: a tenant and an operation. There is no global keyspace: the
/// same key under two tenants, or under two operations, names two independent intents.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Scope {
    tenant: String,
    operation: String,
}

impl Scope {
    /// A scope for `tenant` (a customer, account or client identity) and `operation` (e.g.
    /// `"create_order"`). Validated against the store's [`Limits`] when used.
    pub fn new(tenant: impl Into<String>, operation: impl Into<String>) -> Self {
        Scope {
            tenant: tenant.into(),
            operation: operation.into(),
        }
    }

    /// The tenant.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// The operation.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// A stored record key read back into its parts `(tenant, operation, key)`, as bytes: the
    /// inverse of the layout in docs/FORMAT.md, "Record key" (`0x01 ‖ u16be len ‖ tenant ‖
    /// u16be len ‖ operation ‖ u16be len ‖ key`). For tools that walk the records (the stores'
    /// `for_each_record` hands each record's key out as stored) and must not re-parse the layout
    /// themselves.
    ///
    /// Returns `None` for bytes that are not a record key of this layout: another version byte,
    /// a length that runs past the end, or bytes left over after the key. The tenant and
    /// operation are UTF-8 in every key the store writes (they come from a `Scope`); a key read
    /// from a damaged or foreign file may not be, so they are returned as bytes. A part may be
    /// empty here, though the store never writes an empty one.
    pub fn split_record_key(record_key: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
        let mut rest = record_key.strip_prefix(&[RECORD_KEY_VERSION])?;
        let mut part = || -> Option<&[u8]> {
            let (len, tail) = rest.split_first_chunk::<2>()?;
            let len = usize::from(u16::from_be_bytes(*len));
            let (bytes, tail) = tail.split_at_checked(len)?;
            rest = tail;
            Some(bytes)
        };
        let parts = (part()?, part()?, part()?);
        rest.is_empty().then_some(parts)
    }
}

/// One request: a scope, an idempotency key naming a business intent, and the fingerprint of
/// the request payload (the payload itself is never stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    scope: Scope,
    key: Vec<u8>,
    fingerprint: Fingerprint,
}

impl Request {
    /// A request whose payload is any `serde::Serialize` value, fingerprinted through its
    /// postcard encoding. Maps inside the payload must iterate in a deterministic order
    /// (`BTreeMap`, not `HashMap`), or two equal payloads may fingerprint differently.
    pub fn new<T: serde::Serialize + ?Sized>(
        scope: Scope,
        key: impl AsRef<[u8]>,
        payload: &T,
    ) -> Result<Self, Error> {
        Ok(Request {
            scope,
            key: key.as_ref().to_vec(),
            fingerprint: Fingerprint::of_serialize(payload)?,
        })
    }

    /// A request whose payload the caller has already canonicalised to bytes.
    pub fn from_canonical_bytes(
        scope: Scope,
        key: impl AsRef<[u8]>,
        canonical_payload: &[u8],
    ) -> Self {
        Request {
            scope,
            key: key.as_ref().to_vec(),
            fingerprint: Fingerprint::of_bytes(canonical_payload),
        }
    }

    /// A request with a fingerprint computed elsewhere (e.g. by an HTTP layer).
    pub fn with_fingerprint(scope: Scope, key: impl AsRef<[u8]>, fingerprint: Fingerprint) -> Self {
        Request {
            scope,
            key: key.as_ref().to_vec(),
            fingerprint,
        }
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The idempotency key bytes.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The payload fingerprint.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The key for display and error messages (lossy UTF-8).
    pub(crate) fn key_display(&self) -> String {
        String::from_utf8_lossy(&self.key).into_owned()
    }
}

/// Size limits on the parts of a scoped key. Defaults: key ≤ 255 bytes (Stripe's limit),
/// tenant and operation ≤ 128 bytes each. No limit may exceed 65,535 bytes (the length prefix
/// of the record key is a `u16`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum idempotency key length in bytes. Default 255.
    pub max_key_len: usize,
    /// Maximum tenant length in bytes. Default 128.
    pub max_tenant_len: usize,
    /// Maximum operation length in bytes. Default 128.
    pub max_operation_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_key_len: 255,
            max_tenant_len: 128,
            max_operation_len: 128,
        }
    }
}

/// Hard ceiling for any limit: the record key stores lengths as `u16`.
pub(crate) const MAX_FIELD_LEN: usize = u16::MAX as usize;

impl Limits {
    pub(crate) fn validate(&self) -> Result<(), Error> {
        for (name, v) in [
            ("max_key_len", self.max_key_len),
            ("max_tenant_len", self.max_tenant_len),
            ("max_operation_len", self.max_operation_len),
        ] {
            if v == 0 || v > MAX_FIELD_LEN {
                return Err(Error::Config {
                    reason: format!("{name} is {v}; it must be between 1 and {MAX_FIELD_LEN}"),
                });
            }
        }
        Ok(())
    }

    /// Checks a request against these limits.
    pub(crate) fn check(&self, req: &Request) -> Result<(), Error> {
        check_field(Field::Tenant, req.scope.tenant.len(), self.max_tenant_len)?;
        check_field(
            Field::Operation,
            req.scope.operation.len(),
            self.max_operation_len,
        )?;
        check_field(Field::Key, req.key.len(), self.max_key_len)
    }
}

fn check_field(field: Field, len: usize, max: usize) -> Result<(), Error> {
    if len == 0 {
        return Err(Error::Empty { field });
    }
    if len > max {
        return Err(Error::TooLong { field, len, max });
    }
    Ok(())
}

/// Version byte that starts every record key (see docs/FORMAT.md).
pub(crate) const RECORD_KEY_VERSION: u8 = 1;

/// The composite key of a record: `0x01 ‖ u16be(len tenant) ‖ tenant ‖ u16be(len op) ‖ op ‖
/// u16be(len key) ‖ key`. Length prefixes make it unambiguous: tenant "a:b" + op "c" never
/// equals tenant "a" + op "b:c".
///
/// Invariant: only called on a request that passed [`Limits::check`], so every length fits a
/// `u16` (limits are capped at [`MAX_FIELD_LEN`]).
pub(crate) fn record_key(req: &Request) -> Vec<u8> {
    let t = req.scope.tenant.as_bytes();
    let o = req.scope.operation.as_bytes();
    let k = &req.key;
    let mut out = Vec::with_capacity(7 + t.len() + o.len() + k.len());
    out.push(RECORD_KEY_VERSION);
    for part in [t, o, k.as_slice()] {
        // Lengths were checked against limits ≤ u16::MAX; saturate defensively anyway.
        let len = u16::try_from(part.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&part[..usize::from(len)]);
    }
    out
}

/// The record key of `key` in `scope`, validated against `limits` like a request's (no payload
/// involved).
pub(crate) fn admit_key(
    limits: &Limits,
    scope: &Scope,
    key: impl AsRef<[u8]>,
) -> Result<Vec<u8>, Error> {
    let request =
        Request::with_fingerprint(scope.clone(), key, crate::model::keys::Fingerprint([0; 32]));
    limits.check(&request)?;
    Ok(record_key(&request))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(t: &str, o: &str, k: &str) -> Request {
        Request::from_canonical_bytes(Scope::new(t, o), k, b"")
    }

    #[test]
    fn composite_key_is_unambiguous() {
        assert_ne!(
            record_key(&req("a:b", "c", "k")),
            record_key(&req("a", "b:c", "k"))
        );
        assert_ne!(
            record_key(&req("a", "bc", "k")),
            record_key(&req("ab", "c", "k"))
        );
        assert_ne!(
            record_key(&req("t", "o", "k1")),
            record_key(&req("t", "ok", "1"))
        );
    }

    #[test]
    fn composite_key_golden_bytes() {
        assert_eq!(
            record_key(&req("t1", "op", "k")),
            vec![1, 0, 2, b't', b'1', 0, 2, b'o', b'p', 0, 1, b'k']
        );
    }

    #[test]
    fn a_record_key_splits_back_into_its_parts() {
        let parts: (&[u8], &[u8], &[u8]) = (b"t1", b"op", b"k");
        assert_eq!(
            Scope::split_record_key(&record_key(&req("t1", "op", "k"))),
            Some(parts)
        );
        // The same bytes as `composite_key_golden_bytes`, and the parts that make the composite
        // key unambiguous come back apart.
        let golden = [1, 0, 2, b't', b'1', 0, 2, b'o', b'p', 0, 1, b'k'];
        assert_eq!(Scope::split_record_key(&golden), Some(parts));
        let parts: (&[u8], &[u8], &[u8]) = (b"a:b", b"c", b"k");
        assert_eq!(
            Scope::split_record_key(&record_key(&req("a:b", "c", "k"))),
            Some(parts)
        );
        // Any bytes in the idempotency key, including a long one.
        let long = "x".repeat(300);
        let key = record_key(&req("t", "o", &long));
        assert_eq!(
            Scope::split_record_key(&key).map(|(_, _, k)| k),
            Some(long.as_bytes())
        );
    }

    #[test]
    fn bytes_that_are_not_a_record_key_do_not_split() {
        let good = record_key(&req("t1", "op", "k"));
        assert!(Scope::split_record_key(&[]).is_none());
        // Another version byte.
        let mut other = good.clone();
        other[0] = 2;
        assert!(Scope::split_record_key(&other).is_none());
        // Every truncation, and a byte too many.
        for end in 0..good.len() {
            assert!(Scope::split_record_key(&good[..end]).is_none(), "{end}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(Scope::split_record_key(&longer).is_none());
        // A length that runs past the end.
        assert!(Scope::split_record_key(&[1, 0xff, 0xff, b't']).is_none());
    }

    #[test]
    fn limits_are_enforced() {
        let l = Limits::default();
        assert!(matches!(
            l.check(&req("", "o", "k")),
            Err(Error::Empty {
                field: Field::Tenant
            })
        ));
        assert!(matches!(
            l.check(&req("t", "", "k")),
            Err(Error::Empty {
                field: Field::Operation
            })
        ));
        assert!(matches!(
            l.check(&req("t", "o", "")),
            Err(Error::Empty { field: Field::Key })
        ));
        let long = "x".repeat(256);
        assert!(matches!(
            l.check(&req("t", "o", &long)),
            Err(Error::TooLong {
                field: Field::Key,
                len: 256,
                max: 255
            })
        ));
        assert!(l.check(&req("t", "o", &"x".repeat(255))).is_ok());
        assert!(
            Limits {
                max_key_len: 70_000,
                ..Limits::default()
            }
            .validate()
            .is_err()
        );
    }
}
