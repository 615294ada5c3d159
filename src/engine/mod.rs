//! The redb engine: the store and its builder, group commit, the transaction handle, the tables,
//! the expiry index and sweeps, leases, and the maintenance operations. It stores the pure model's
//! values and applies its rules; it knows nothing of messaging or of the faces.

pub(crate) mod background;
pub(crate) mod boundary;
pub(crate) mod builder;
pub(crate) mod commit;
pub(crate) mod expiry;
pub(crate) mod lease;
pub(crate) mod maintenance;
pub(crate) mod marks;
pub(crate) mod read_only;
pub(crate) mod signal;
pub(crate) mod store;
pub(crate) mod sweep;
pub(crate) mod tables;
pub(crate) mod tx;
