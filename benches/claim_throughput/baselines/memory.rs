//! `Mutex<HashMap>`: the same CPU work as a claim with no durability, the CPU ceiling.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::data::{now_ms, record_key, record_value};

/// The records and the callers' rows, in memory.
#[derive(Default)]
pub struct Memory {
    records: HashMap<Vec<u8>, Vec<u8>>,
    effects: HashMap<Vec<u8>, u64>,
}

/// The same CPU work as a claim (fingerprint, record encoding) under one mutex; no durability.
pub fn memory_claim(mem: &Mutex<Memory>, key: &str) {
    let record_key = record_key(key);
    let value = record_value(key, now_ms());
    let mut m = mem.lock().expect("memory lock");
    assert!(!m.records.contains_key(&record_key), "memory claim {key}");
    m.effects.insert(key.as_bytes().to_vec(), 1);
    m.records.insert(record_key, value);
}
