//! The payment handlers: a capture and a refund booked inside the transaction that records
//! the layer's answer, and the problems they record.

use axum::http::header::{CONTENT_TYPE, LOCATION};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use idem::Abort;
use idem::http::{PROBLEM_JSON, Recorded};
use serde_json::{Value, json};

use crate::*;

/// The request body of `POST /v1/payments`.
#[derive(serde::Deserialize)]
pub(crate) struct NewPayment {
    pub(crate) account: String,
    pub(crate) amount: i64,
    pub(crate) currency: String,
}

/// A problem answer recorded by [`IdempotencyHandle::complete_with`] (replayed as it is, with its
/// `application/problem+json` content type).
pub(crate) fn recorded_problem(
    status: StatusCode,
    kind: &str,
    title: &str,
    detail: &str,
) -> Recorded {
    let body = json!({"type": kind, "title": title, "status": status.as_u16(), "detail": detail});
    let mut answer = Recorded::json(status, &body);
    answer
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    answer
}

pub(crate) fn invalid(detail: &str) -> Recorded {
    recorded_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        problem::INVALID_PAYMENT,
        "Invalid payment",
        detail,
    )
}

pub(crate) fn ledger_out_of_range(total: i64, entry: i64) -> Recorded {
    recorded_problem(
        StatusCode::UNPROCESSABLE_ENTITY,
        problem::LEDGER_OUT_OF_RANGE,
        "Ledger total out of range",
        &format!(
            "the tenant's ledger total {total} plus {entry} does not fit in a signed 64-bit \
             integer (from {} to {}); nothing was booked",
            i64::MIN,
            i64::MAX
        ),
    )
}

pub(crate) async fn create_payment<E: Engine>(
    Tenant(tenant): Tenant,
    Claimed(idem): Claimed<E>,
    body: axum::body::Bytes,
) -> Response
where
    for<'t> TxOf<'t, E>: Books,
{
    // The id derives from the idempotency key: the same on every attempt of this intent.
    let hex = idem.downstream_key().to_hex();
    let id = format!("pay_{}", hex.get(..20).unwrap_or(&hex));
    idem.complete_with(move |mut tx| capture(&mut tx, &tenant, &id, &body))
        .await
}

/// Books a new payment `id` for `tenant` from the request `body`, in the transaction that
/// records the answer.
pub fn capture(
    books: &mut impl Books,
    tenant: &str,
    id: &str,
    body: &[u8],
) -> Result<Recorded, Abort> {
    let new: NewPayment = match serde_json::from_slice(body) {
        Ok(p) => p,
        Err(e) => {
            return Ok(invalid(&format!(
                "expected {{\"account\", \"amount\", \"currency\"}}: {e}"
            )));
        }
    };
    if !(1..=MAX_AMOUNT).contains(&new.amount) {
        return Ok(recorded_problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            problem::AMOUNT_OUT_OF_RANGE,
            "Amount out of range",
            &format!(
                "amount is {}; it must be an integer number of minor units from 1 to \
                 {MAX_AMOUNT}",
                new.amount
            ),
        ));
    }
    if new.currency.len() != 3 || new.account.is_empty() {
        return Ok(invalid(
            "currency must be a 3-letter code, account non-empty",
        ));
    }
    // Checked before any write: a 4xx is recorded with the closure's writes, so nothing may be
    // written on the refusal path.
    let total = books.total(tenant)?;
    let Some(new_total) = total.checked_add(new.amount) else {
        return Ok(ledger_out_of_range(total, new.amount));
    };
    let payment = json!({
        "id": id, "account": new.account, "amount": new.amount,
        "currency": new.currency, "status": "captured",
    });
    let stored = json!({"tenant": tenant, "payment": payment}).to_string();
    books.put_payment(id, &stored)?;
    books.book(tenant, &format!("{id}:capture"), new.amount, new_total)?;
    books.push(payment_event("payment.captured", tenant, id, &payment))?;
    let mut answer = Recorded::json(StatusCode::CREATED, &payment);
    if let Ok(loc) = format!("/v1/payments/{id}").parse() {
        answer.headers.insert(LOCATION, loc);
    }
    Ok(answer)
}

pub(crate) async fn refund_payment<E: Engine>(
    Tenant(tenant): Tenant,
    PaymentId(id): PaymentId,
    Claimed(idem): Claimed<E>,
) -> Response
where
    for<'t> TxOf<'t, E>: Books,
{
    idem.complete_with(move |mut tx| refund(&mut tx, &tenant, &id))
        .await
}

/// Refunds payment `id` of `tenant` (once: a refunded payment answers as it is), in the
/// transaction that records the answer.
pub fn refund(books: &mut impl Books, tenant: &str, id: &str) -> Result<Recorded, Abort> {
    let found = books.payment(id)?;
    let Some(mut row) = found
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .filter(|row| row["tenant"] == tenant)
    else {
        return Ok(recorded_problem(
            StatusCode::NOT_FOUND,
            problem::NO_SUCH_PAYMENT,
            "No such payment",
            "no payment with this id for this tenant",
        ));
    };
    let captured = row["payment"]["status"] == "captured";
    if let Some(payment) = row.get_mut("payment").and_then(Value::as_object_mut)
        && captured
    {
        // Stored amounts were range-checked when captured; `checked_neg` and `checked_add`
        // still refuse a row that would not fit rather than wrap.
        let amount = payment.get("amount").and_then(Value::as_i64).unwrap_or(0);
        let total = books.total(tenant)?;
        let Some((entry, new_total)) = amount
            .checked_neg()
            .and_then(|entry| Some((entry, total.checked_add(entry)?)))
        else {
            return Ok(ledger_out_of_range(total, amount.saturating_neg()));
        };
        payment.insert("status".into(), json!("refunded"));
        books.put_payment(id, &row.to_string())?;
        books.book(tenant, &format!("{id}:refund"), entry, new_total)?;
        books.push(payment_event(
            "payment.refunded",
            tenant,
            id,
            &row["payment"],
        ))?;
    }
    Ok(Recorded::json(StatusCode::OK, &row["payment"]))
}
