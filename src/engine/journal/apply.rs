//! Applying redo records to redb at recovery: each table an entry names is opened with its Rust
//! types, which a record's bytes alone cannot give. idem's own tables are known; the caller's
//! are registered on the builder ([`crate::StoreBuilder::journal_table`]).

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;

use redb::{Key, TableDefinition, TableHandle, Value, WriteTransaction};

use crate::engine::journal::format::{OP_PUT, OP_REMOVE, Redo, TableRef};
use crate::engine::tables;

/// A table recovery can open for writing with its types.
pub(crate) trait TableType: Send + Sync {
    /// redb's names of the key and value types, computed once at registration.
    fn types(&self) -> (&str, &str);
    /// Opens the table in `txn`.
    fn open<'t>(&self, txn: &'t WriteTransaction) -> Result<Box<dyn Apply + 't>, redb::Error>;
    /// Why `key` and `value` are not a key and a value of the table's types, if they are not:
    /// checked before anything is applied, since redb's `from_bytes` may panic on such bytes.
    fn check(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), String>;
}

/// Whether `bytes` decode as a `T` (its width, and a trial `from_bytes`, which panics on bytes
/// its type never writes).
fn decodes<T: Value + 'static>(bytes: &[u8]) -> bool {
    if T::fixed_width().is_some_and(|w| w != bytes.len()) {
        return false;
    }
    std::panic::catch_unwind(|| drop(T::from_bytes(bytes))).is_ok()
}

/// An open table that takes redo records.
pub(crate) trait Apply {
    fn apply(&mut self, op: u8, key: &[u8], value: Option<&[u8]>) -> Result<(), redb::Error>;
}

/// A table by name with its types (a function-pointer marker: names and types are all it
/// holds, so it is `Send + Sync` whatever `K` and `V` are).
struct Typed<K: Key + 'static, V: Value + 'static> {
    name: String,
    key_type: String,
    value_type: String,
    types: PhantomData<fn() -> (K, V)>,
}

impl<K: Key + 'static, V: Value + 'static> TableType for Typed<K, V> {
    fn types(&self) -> (&str, &str) {
        (&self.key_type, &self.value_type)
    }

    fn check(&self, key: &[u8], value: Option<&[u8]>) -> Result<(), String> {
        if !decodes::<K>(key) {
            return Err(format!(
                "a journal record's key ({} bytes) is not a {} of the table `{}`",
                key.len(),
                K::type_name().name(),
                self.name
            ));
        }
        if let Some(v) = value
            && !decodes::<V>(v)
        {
            return Err(format!(
                "a journal record's value ({} bytes) is not a {} of the table `{}`",
                v.len(),
                V::type_name().name(),
                self.name
            ));
        }
        Ok(())
    }

    fn open<'t>(&self, txn: &'t WriteTransaction) -> Result<Box<dyn Apply + 't>, redb::Error> {
        Ok(Box::new(
            txn.open_table(TableDefinition::<K, V>::new(&self.name))?,
        ))
    }
}

impl<K: Key + 'static, V: Value + 'static> Apply for redb::Table<'_, K, V> {
    fn apply(&mut self, op: u8, key: &[u8], value: Option<&[u8]>) -> Result<(), redb::Error> {
        match (op, value) {
            (OP_PUT, Some(v)) => {
                self.insert(K::from_bytes(key), V::from_bytes(v))?;
            }
            (OP_REMOVE, _) => {
                self.remove(K::from_bytes(key))?;
            }
            // Invariant: `decode_body` admits only puts with a value and removes on a plain
            // table, and `Registry::check` only plain tables.
            _ => {}
        }
        Ok(())
    }
}

fn typed<K: Key + 'static, V: Value + 'static>(name: String) -> Arc<dyn TableType> {
    Arc::new(Typed::<K, V> {
        name,
        key_type: K::type_name().name().to_owned(),
        value_type: V::type_name().name().to_owned(),
        types: PhantomData,
    })
}

/// Whether `name` is the name redb gives type `T`.
fn is<T: Value + 'static>(name: &str) -> bool {
    T::type_name().name() == name
}

/// The [`leaf`] tables: each pair of key and value types gets its own copy of redb's B-tree
/// code, so the list is the common pairs, not every combination (a build-time cost).
macro_rules! leaf_pairs {
    ($name:expr, $key_type:expr, $value_type:expr, [$(($K:ty, $V:ty)),*]) => {
        $(
            if is::<$K>($key_type) && is::<$V>($value_type) {
                return Some(typed::<$K, $V>($name.to_owned()));
            }
        )*
    };
}

/// A table whose key and value types are a common pair of redb's leaf types (`&str`, `&[u8]`
/// or `u64` keys; `&str`, `&[u8]`, `String`, `Vec<u8>`, `u64`, `u32`, `i64`, `u8`, `bool` or `()`
/// values): recovery and the applier open it from the type names an entry records, so it needs
/// no registration. Other tables are registered with `StoreBuilder::journal_table`.
fn leaf(name: &str, key_type: &str, value_type: &str) -> Option<Arc<dyn TableType>> {
    leaf_pairs!(
        name,
        key_type,
        value_type,
        [
            (&'static str, &'static str),
            (&'static str, &'static [u8]),
            (&'static str, String),
            (&'static str, u64),
            (&'static str, u32),
            (&'static str, i64),
            (&'static str, bool),
            (&'static str, ()),
            (&'static [u8], &'static [u8]),
            (&'static [u8], Vec<u8>),
            (&'static [u8], u64),
            (&'static [u8], u8),
            (&'static [u8], ()),
            (u64, &'static str),
            (u64, &'static [u8]),
            (u64, u64),
            (u64, ())
        ]
    );
    None
}

/// The tables recovery can apply records to, by name.
#[derive(Clone, Default)]
pub(crate) struct Registry(HashMap<String, Arc<dyn TableType>>);

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl Registry {
    /// idem's own tables.
    pub(crate) fn with_idem_tables() -> Self {
        let mut r = Registry::default();
        r.add(tables::RECORDS);
        r.add(tables::EXPIRY);
        r.add(tables::META);
        r.add(tables::INBOX);
        r.add(tables::OUTBOX);
        r.add(tables::OUTBOX_DEAD);
        r.add(tables::VERSIONS);
        r
    }

    /// Registers a table (replacing one of the same name).
    pub(crate) fn add<K: Key + 'static, V: Value + 'static>(
        &mut self,
        definition: TableDefinition<'static, K, V>,
    ) {
        let name = definition.name().to_owned();
        self.0.insert(name.clone(), typed::<K, V>(name));
    }

    /// The table `name` with these types: registered, or else of redb's leaf types
    /// ([`leaf`]), which need no registration.
    fn table(&self, name: &str, key_type: &str, value_type: &str) -> Option<Arc<dyn TableType>> {
        match self.0.get(name) {
            Some(t) if t.types() == (key_type, value_type) => Some(Arc::clone(t)),
            _ => leaf(name, key_type, value_type),
        }
    }

    /// Whether `name` with these types can be applied: registered, or of leaf types.
    pub(crate) fn knows(&self, name: &str, key_type: &str, value_type: &str) -> bool {
        self.table(name, key_type, value_type).is_some()
    }

    /// Why an entry's tables cannot all be applied, if they cannot: recovery refuses before it
    /// applies anything, since applying the other records alone would split a batch.
    pub(crate) fn check(&self, tables: &[TableRef]) -> Result<(), String> {
        for t in tables {
            if t.kind != crate::engine::journal::format::TABLE_PLAIN
                || !self.knows(&t.name, &t.key_type, &t.value_type)
            {
                return Err(format!(
                    "the journal holds writes to the table `{}` ({} -> {}), which this open does not know: register it with StoreBuilder::journal_table(TableDefinition::<K, V>::new(\"{}\")) with those key and value types before opening, as the program that wrote it did (the `idem` CLI registers no tables of yours: open the store once with that program, which replays the journal and closes it cleanly, then run the command again)",
                    t.name, t.key_type, t.value_type, t.name
                ));
            }
        }
        Ok(())
    }

    /// Why a record of a checked entry is not of its table's types, if one is not.
    pub(crate) fn check_records(
        &self,
        tables: &[TableRef],
        records: &[Redo],
        body: &[u8],
    ) -> Result<(), String> {
        for r in records {
            let t = &tables[usize::from(r.table)];
            if let Some(ty) = self.table(&t.name, &t.key_type, &t.value_type) {
                ty.check(&body[r.key.clone()], r.value.clone().map(|v| &body[v]))?;
            }
        }
        Ok(())
    }

    /// Applies one decoded entry (`body` its bytes) in `txn`, opening its tables in `open`.
    pub(crate) fn apply<'t>(
        &self,
        txn: &'t WriteTransaction,
        open: &mut HashMap<String, Box<dyn Apply + 't>>,
        tables: &[TableRef],
        records: &[Redo],
        body: &[u8],
    ) -> Result<(), redb::Error> {
        for r in records {
            let t = &tables[usize::from(r.table)];
            if !open.contains_key(&t.name) {
                // Invariant: `check` passed for these tables before anything was applied.
                let Some(ty) = self.table(&t.name, &t.key_type, &t.value_type) else {
                    continue;
                };
                open.insert(t.name.clone(), ty.open(txn)?);
            }
            if let Some(table) = open.get_mut(&t.name) {
                let value = r.value.clone().map(|v| &body[v]);
                table.apply(r.op, &body[r.key.clone()], value)?;
            }
        }
        Ok(())
    }
}
