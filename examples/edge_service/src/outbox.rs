//! The outbox side: the payment events the handlers push, the dispatcher that delivers them
//! (its publisher prints each event), and what this process delivered per tenant.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use idem::outbox::{DispatcherHandle, DispatcherOptions, Event, StoredEvent};
use serde_json::Value;

use crate::*;

/// Events of each tenant that this process handed to the broker (here: stdout), shared by the
/// dispatcher's publisher and `GET /v1/outbox`.
#[derive(Clone, Default)]
pub struct Delivered(Arc<Mutex<HashMap<String, u64>>>);

impl Delivered {
    fn add(&self, tenant: &str) {
        // A poisoned lock only means a panic while counting: the map is still usable.
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *map.entry(tenant.to_owned()).or_default() += 1;
    }

    pub(crate) fn of(&self, tenant: &str) -> u64 {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(tenant).copied().unwrap_or(0)
    }
}

/// The outbox event of a payment state change: ordered per payment, so a consumer never sees
/// the refund before the capture. The `tenant` header scopes `GET /v1/outbox`.
pub(crate) fn payment_event(kind: &str, tenant: &str, id: &str, payment: &Value) -> Event {
    Event::new("payments", payment.to_string())
        .ordering_key(id)
        .header("type", kind)
        .header("tenant", tenant)
}

pub(crate) fn header<'a>(event: &'a StoredEvent, name: &str) -> Option<&'a str> {
    event
        .headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// One line per published event (no broker here: stdout stands in for it).
pub fn describe(event: &StoredEvent) -> String {
    format!(
        "published seq={} id={} topic={} tenant={} key={} type={} payload={}",
        event.seq,
        event.id,
        event.topic,
        header(event, "tenant").unwrap_or("-"),
        event.ordering_key.as_deref().unwrap_or("-"),
        header(event, "type").unwrap_or("-"),
        String::from_utf8_lossy(&event.payload)
    )
}

/// Starts the outbox dispatcher of the service: its publisher prints each event on stdout
/// ([`describe`]), counts it in `delivered` and reports it delivered. A real service would
/// send it to its broker here.
pub fn start_dispatcher<E: Engine>(
    store: &E,
    delivered: Delivered,
) -> Result<DispatcherHandle, idem::Error> {
    Engine::start_dispatcher(
        store,
        move |event: &StoredEvent| -> Result<(), idem::error::BoxError> {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            writeln!(out, "edge_service: {}", describe(event))?;
            out.flush()?;
            delivered.add(header(event, "tenant").unwrap_or(""));
            Ok(())
        },
        DispatcherOptions::new(),
    )
}
