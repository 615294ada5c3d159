//! `PgStore::execute_typed`: flow A with a serde value as the answer (`model/typed.rs`).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::Error;
use crate::model::response::Abort;
use crate::model::scope::Request;
use crate::model::typed::{ExecuteTypedAnswer, decode, encode};
use crate::postgres::store::PgStore;
use crate::postgres::tx::PgTx;

impl PgStore {
    /// Flow A with a typed answer: [`PgStore::execute`], but `f` returns a serde value, stored
    /// and given back decoded on every replay (same contract as the file store's
    /// `Store::execute_typed`).
    pub fn execute_typed<T, F>(
        &self,
        request: Request,
        mut f: F,
    ) -> Result<ExecuteTypedAnswer<T>, Error>
    where
        T: Serialize + DeserializeOwned,
        F: for<'t> FnMut(&'t mut PgTx<'t>) -> Result<T, Abort>,
    {
        decode(self.execute(request, |tx| encode(&f(tx)?))?)
    }
}
