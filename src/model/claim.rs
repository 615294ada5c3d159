//! A flow-B request that a retry recognises as its own: [`Claim`].

use crate::model::record::HolderToken;
use crate::model::scope::Request;

/// How many holder tokens a claim remembers: those of its latest calls that may have written
/// one (an older one is forgotten first).
const REMEMBERED: usize = 16;

/// A flow-B request whose retries recognise the lease it already took: begin it with
/// `begin_claim` (`Store::begin_claim`, `PgStore::begin_claim`), and when a call fails, call
/// again with the same `Claim`.
///
/// Why: a `begin` whose claim committed but whose answer was lost — [`Error::OutcomeUnknown`]
/// (the connection failed at the commit, or the file store's commit failed), or any failure
/// after the commit — leaves the key Pending under a holder token that no lease holds. A plain
/// `begin` cannot tell that record from another attempt's: it answers `InFlight` until the lease
/// lapses, then takes it over. Each call of `begin_claim` draws a fresh holder token and the
/// claim remembers it, so a retry with the same claim finds one of its own tokens on the record
/// ([`Decision::Resume`](crate::rules::Decision::Resume)) and takes the lease at once, under a
/// new token, with the same attempt number and downstream key. A claim that never landed is
/// simply claimed again.
///
/// A claim recognises only tokens drawn for its own calls (a clone shares the tokens drawn
/// before it was made), so it never takes a lease another caller holds. If an earlier call of the same claim did hand out a lease, the retry takes it
/// back: that lease is fenced out ([`Error::LeaseLost`] on its next call), exactly as after a
/// takeover, so the key still has one holder. Retry with the claim only while you hold none of
/// its leases. It remembers the tokens of its latest 16 calls that may have written one.
///
/// The engines' `begin_claim` docs show a retry loop.
///
/// [`Error::OutcomeUnknown`]: crate::Error::OutcomeUnknown
/// [`Error::LeaseLost`]: crate::Error::LeaseLost
#[derive(Debug, Clone)]
pub struct Claim {
    request: Request,
    /// The holder tokens drawn for this claim's calls that may have been written, oldest
    /// first, at most [`REMEMBERED`].
    tokens: Vec<HolderToken>,
}

impl Claim {
    /// A claim for `request` that no call has made yet.
    pub fn new(request: Request) -> Self {
        Claim {
            request,
            tokens: Vec::new(),
        }
    }

    /// The request this claim is for.
    pub fn request(&self) -> &Request {
        &self.request
    }

    /// The request, giving the claim up.
    pub fn into_request(self) -> Request {
        self.request
    }

    /// Remembers `token`, drawn for a call of this claim before its first write (the oldest
    /// token goes beyond [`REMEMBERED`]).
    pub(crate) fn issue(&mut self, token: HolderToken) {
        if self.tokens.len() >= REMEMBERED {
            self.tokens.remove(0);
        }
        self.tokens.push(token);
    }

    /// Forgets `token`: its call answered without writing it.
    pub(crate) fn withdraw(&mut self, token: &HolderToken) {
        self.tokens.retain(|t| t != token);
    }

    /// The tokens a record of this claim's own may carry.
    pub(crate) fn tokens(&self) -> &[HolderToken] {
        &self.tokens
    }
}

impl From<Request> for Claim {
    fn from(request: Request) -> Self {
        Claim::new(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::scope::Scope;

    fn token(n: u8) -> HolderToken {
        HolderToken([n; 16])
    }

    #[test]
    fn a_claim_remembers_its_latest_tokens_and_forgets_withdrawn_ones() {
        let mut claim = Claim::new(Request::from_canonical_bytes(
            Scope::new("t", "op"),
            "k",
            b"p",
        ));
        assert!(claim.tokens().is_empty());
        for n in 0..20 {
            claim.issue(token(n));
        }
        let kept: Vec<u8> = claim.tokens().iter().map(|t| t.0[0]).collect();
        assert_eq!(
            kept,
            (4..20).collect::<Vec<u8>>(),
            "the latest 16, oldest first"
        );
        claim.withdraw(&token(19));
        claim.withdraw(&token(3));
        assert_eq!(claim.tokens().len(), 15);
        assert!(!claim.tokens().contains(&token(19)));
        assert_eq!(claim.request().key(), b"k");
    }
}
