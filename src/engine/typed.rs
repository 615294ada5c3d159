//! `Store::execute_typed`: flow A for work that answers with a serde value instead of a
//! [`crate::Response`] (the value and its decoding are `model/typed.rs`).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::engine::store::Store;
use crate::engine::tx::Tx;
use crate::error::Error;
use crate::model::response::Abort;
use crate::model::scope::Request;
use crate::model::typed::{ExecuteTypedAnswer, decode, encode};

impl Store {
    /// Flow A with a typed answer: [`Store::execute`], but `f` returns a serde value, which is
    /// stored (postcard-encoded, status 200) and given back decoded on every replay, so a queue
    /// worker needs no `Response` of its own. `Abort::Terminal(response)` is stored and replayed
    /// as [`ExecuteTypedAnswer::Rejected`]. A stored answer that no longer decodes as `T` (the operation's
    /// answer type changed) is [`Error::CorruptRecord`] for that key.
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let dir = tempfile::tempdir()?;
    /// use idem::{Request, Scope, Store};
    /// use idem::store::ExecuteTypedAnswer;
    ///
    /// #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    /// struct Reserved { sku: String, units: u32 }
    ///
    /// let store = Store::open(dir.path().join("idem.redb"))?;
    /// let reserve = || {
    ///     let req = Request::from_canonical_bytes(Scope::new("shop", "reserve"), "msg-17", b"sku-1x2");
    ///     store.execute_typed(req, |_tx| Ok(Reserved { sku: "sku-1".into(), units: 2 }))
    /// };
    /// let first = reserve()?;
    /// let again = reserve()?; // redelivered: the stored value, decoded; nothing runs
    /// assert!(matches!(first, ExecuteTypedAnswer::Ran(_)));
    /// assert_eq!(again, ExecuteTypedAnswer::Replayed(Reserved { sku: "sku-1".into(), units: 2 }));
    /// # Ok(())
    /// # }
    /// ```
    pub fn execute_typed<T, F>(
        &self,
        request: Request,
        mut f: F,
    ) -> Result<ExecuteTypedAnswer<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut(&Tx<'_>) -> Result<T, Abort>,
    {
        decode(self.execute(request, |tx| encode(&f(tx)?))?)
    }
}
