//! RabbitMQ's sorting, filtering and pagination of list replies (`rabbit_mgmt_util`'s
//! `reply_list_or_paginate`), as one function over a finished list: a handler gathers its items
//! as JSON objects and ends with [`list_reply`].
//!
//! - `sort` (a key, dotted for nested ones: `message_stats.publish_details.rate`) and
//!   `sort_reverse=true` apply with or without paging. The items are ordered by the key, then by
//!   `vhost`, then `name` (RabbitMQ's default sort, used alone when `sort` is absent or empty),
//!   in Erlang's term order: numbers (a missing key counts as 0) before `false`, `null`, `true`,
//!   objects, arrays, then strings (byte order). `sort_reverse` reverses the whole list.
//! - `page` (from 1) turns the reply into an object: `filtered_count`, `item_count`, `items`,
//!   `page`, `page_count`, `page_size` (default 100, at most 500), `total_count`. Only then does
//!   `name` filter the items (case-insensitive substring, or with `use_regex=true` an unanchored
//!   case-insensitive regex), as in RabbitMQ.
//! - Bad parameters get RabbitMQ's 400 bodies: `invalid_pagination_parameters` (page < 1,
//!   page_size out of 1..=500), `page_out_of_range` (past the page after the last item) and
//!   `bad_request` "Pagination parameters are invalid" (not an integer, an invalid regex).
//!
//! Cost: the sort compares borrowed keys (no item is copied), only the requested page is moved
//! into the reply, and a long list's other items are freed by a thread of their own rather than
//! before the reply (freeing 100,000 queue objects takes longer than sorting them).

use std::cmp::Ordering;
use std::collections::HashMap;

use axum::http::StatusCode;
use serde_json::{json, Map, Value};

use crate::api::{ok_json, ApiError, ApiResult};

/// The query string of a list request (every parameter, unparsed).
pub(crate) type ListParams = HashMap<String, String>;

/// RabbitMQ's `?DEFAULT_PAGE_SIZE`.
const PAGE_SIZE_DEFAULT: i64 = 100;
/// RabbitMQ's `?MAX_PAGE_SIZE`.
const PAGE_SIZE_MAX: i64 = 500;
/// The compiled size a `name` regex may reach (Rust's regex runs in linear time; this bounds
/// the memory a pattern from a URL can take).
const REGEX_SIZE_MAX_BYTES: usize = 1 << 20;

/// What a list request asked for, validated.
struct Request {
    sort: Option<Vec<String>>,
    reverse: bool,
    page: Option<Page>,
}

struct Page {
    number: i64,
    size: i64,
    filter: Option<Filter>,
}

enum Filter {
    Substring(String),
    Regex(regex::Regex),
}

fn invalid() -> ApiError {
    ApiError(
        StatusCode::BAD_REQUEST,
        json!({"error": "bad_request", "reason": "Pagination parameters are invalid"}),
    )
}

/// An integer parameter as Erlang's `list_to_integer` reads it (an optional sign, digits).
fn int_param(p: &ListParams, key: &str) -> Result<Option<i64>, ApiError> {
    match p.get(key) {
        None => Ok(None),
        Some(s) => s.parse::<i64>().map(Some).map_err(|_| invalid()),
    }
}

fn parse(p: &ListParams) -> Result<Request, ApiError> {
    let page_number = int_param(p, "page")?;
    let page_size = int_param(p, "page_size")?;
    let page = match (page_number, page_size) {
        (None, _) => None,
        (Some(n), None) if n > 0 => Some((n, PAGE_SIZE_DEFAULT)),
        (Some(n), Some(s)) if n > 0 && s > 0 && s <= PAGE_SIZE_MAX => Some((n, s)),
        (Some(n), s) => {
            let s = s.map_or_else(|| "undefined".to_string(), |s| s.to_string());
            return Err(ApiError(
                StatusCode::BAD_REQUEST,
                json!({"error": "invalid_pagination_parameters",
                       "reason": format!("Invalid pagination parameters: page number {n}, page size {s}")}),
            ));
        }
    };
    let page = match page {
        None => None,
        Some((number, size)) => {
            let filter = match p.get("name").filter(|n| !n.is_empty()) {
                None => None,
                Some(n) if p.get("use_regex").map(String::as_str) == Some("true") => {
                    let re = regex::RegexBuilder::new(n)
                        .case_insensitive(true)
                        .size_limit(REGEX_SIZE_MAX_BYTES)
                        .build()
                        .map_err(|_| invalid())?;
                    Some(Filter::Regex(re))
                }
                Some(n) => Some(Filter::Substring(n.to_lowercase())),
            };
            Some(Page {
                number,
                size,
                filter,
            })
        }
    };
    let sort = p
        .get("sort")
        .filter(|s| !s.is_empty())
        .map(|s| s.split('.').map(str::to_string).collect());
    Ok(Request {
        sort,
        reverse: p.get("sort_reverse").map(String::as_str) == Some("true"),
        page,
    })
}

/// The value at a dotted key (`None`: missing, which sorts as 0, as
/// `rabbit_mgmt_util:get_dotted_value`).
fn dotted<'a>(item: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(item, |v, k| v.get(k))
}

/// Erlang's term order, as JSON values map to terms: number < atom (false < null < true) <
/// map < list < binary. `None` (a missing key) is the number 0.
fn rank(v: Option<&Value>) -> u8 {
    match v {
        None | Some(Value::Number(_)) => 0,
        Some(Value::Bool(_) | Value::Null) => 1,
        Some(Value::Object(_)) => 2,
        Some(Value::Array(_)) => 3,
        Some(Value::String(_)) => 4,
    }
}

fn erlang_cmp(a: Option<&Value>, b: Option<&Value>) -> Ordering {
    let (ra, rb) = (rank(a), rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    let num = |v: Option<&Value>| v.and_then(Value::as_f64).unwrap_or(0.0);
    match (a, b) {
        (Some(Value::String(x)), Some(Value::String(y))) => x.as_bytes().cmp(y.as_bytes()),
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            for (p, q) in x.iter().zip(y) {
                let o = erlang_cmp(Some(p), Some(q));
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Some(Value::Object(_)), _) => Ordering::Equal,
        _ if ra == 1 => atom(a).cmp(atom(b)),
        _ => num(a).total_cmp(&num(b)),
    }
}

fn atom(v: Option<&Value>) -> &'static str {
    match v {
        Some(Value::Bool(false)) => "false",
        Some(Value::Bool(true)) => "true",
        _ => "null",
    }
}

/// The sort key of an item: the requested key, then `vhost`, then `name`.
fn key<'a>(item: &'a Value, sort: Option<&[String]>) -> [Option<&'a Value>; 3] {
    [
        sort.and_then(|s| dotted(item, s)),
        item.get("vhost"),
        item.get("name"),
    ]
}

fn cmp_keys(a: &[Option<&Value>; 3], b: &[Option<&Value>; 3], sorted_by: bool) -> Ordering {
    let start = if sorted_by { 0 } else { 1 };
    for i in start..3 {
        // vhost and name: a missing one is 0 too.
        let o = erlang_cmp(a[i], b[i]);
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn matches(f: &Filter, item: &Value) -> bool {
    let Some(name) = item.get("name").and_then(Value::as_str) else {
        return false;
    };
    match f {
        Filter::Substring(s) => name.to_lowercase().contains(s.as_str()),
        Filter::Regex(re) => re.is_match(name),
    }
}

/// Sorts, filters and pages `items` (a JSON array; anything else is answered as it is) as
/// RabbitMQ answers a list request with these parameters.
pub(crate) fn list_reply(items: Value, params: &ListParams) -> ApiResult {
    let req = parse(params)?;
    let Value::Array(items) = items else {
        return ok_json(items);
    };
    ok_json(paginate(items, &req)?)
}

fn paginate(items: Vec<Value>, req: &Request) -> Result<Value, ApiError> {
    let total = items.len();
    let sort = req.sort.as_deref();
    let mut order: Vec<(usize, [Option<&Value>; 3])> = items
        .iter()
        .enumerate()
        .map(|(i, it)| (i, key(it, sort)))
        .collect();
    order.sort_by(|a, b| cmp_keys(&a.1, &b.1, sort.is_some()));
    if req.reverse {
        order.reverse();
    }
    let mut order: Vec<usize> = order.into_iter().map(|(i, _)| i).collect();
    let Some(page) = &req.page else {
        return Ok(Value::Array(take(items, &order)));
    };
    if let Some(f) = &page.filter {
        order.retain(|&i| matches(f, &items[i]));
    }
    let filtered = order.len();
    // RabbitMQ's lists:sublist(List, Offset, Size): the offset may be one past the end.
    let offset = (page.number - 1).saturating_mul(page.size);
    if offset > filtered as i64 {
        return Err(ApiError(
            StatusCode::BAD_REQUEST,
            json!({"error": "page_out_of_range",
                   "reason": format!("Page out of range, page: {} page size: {}, len: {}",
                                     page.number, page.size, filtered)}),
        ));
    }
    let offset = offset as usize;
    let end = filtered.min(offset + page.size as usize);
    let shown = take(items, &order[offset..end]);
    let mut out = Map::new();
    out.insert("filtered_count".into(), json!(filtered));
    out.insert("item_count".into(), json!(shown.len()));
    out.insert("items".into(), Value::Array(shown));
    out.insert("page".into(), json!(page.number));
    let page_count = (filtered as i64 + page.size - 1) / page.size;
    out.insert("page_count".into(), json!(page_count));
    out.insert("page_size".into(), json!(page.size));
    out.insert("total_count".into(), json!(total));
    Ok(Value::Object(out))
}

/// The items at `order`'s indexes, in that order, moved out of `items`; the rest are freed
/// off the request's path ([`dispose`]).
fn take(mut items: Vec<Value>, order: &[usize]) -> Vec<Value> {
    let out = order
        .iter()
        .map(|&i| std::mem::take(&mut items[i]))
        .collect();
    dispose(items);
    out
}

/// Lists longer than this are freed on a thread of their own.
const DISPOSE_ON_THREAD_MIN: usize = 10_000;

/// Frees the items a page left out. A hundred thousand queue objects take longer to free
/// (hundreds of ms: a tree of maps each) than to sort, so a long list is freed by a thread of
/// its own while the reply goes; a short one (or if no thread can be started) here.
fn dispose(items: Vec<Value>) {
    if items.len() < DISPOSE_ON_THREAD_MIN {
        return;
    }
    // Were no thread started, the closure, items and all, would be dropped here.
    let _ = std::thread::Builder::new()
        .name("mgmt-free".into())
        .spawn(move || drop(items));
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn params(q: &[(&str, &str)]) -> ListParams {
        q.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn run(items: Value, q: &[(&str, &str)]) -> Result<Value, (StatusCode, Value)> {
        let req = parse(&params(q)).map_err(|e| (e.0, e.1))?;
        let Value::Array(items) = items else {
            unreachable!()
        };
        paginate(items, &req).map_err(|e| (e.0, e.1))
    }

    fn queues(n: usize) -> Value {
        Value::Array(
            (0..n)
                .map(|i| json!({"vhost": "/", "name": format!("q{i:03}"), "messages": (i * 7) % 5}))
                .collect(),
        )
    }

    fn names(v: &Value) -> Vec<String> {
        let list = v.get("items").unwrap_or(v);
        list.as_array()
            .unwrap()
            .iter()
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn without_page_a_plain_list_sorted_by_vhost_then_name() {
        let items = json!([
            {"vhost": "b", "name": "a"}, {"vhost": "a", "name": "z"}, {"vhost": "a", "name": "c"}
        ]);
        let out = run(items, &[("name", "zz"), ("page_size", "1")]).unwrap();
        assert!(out.is_array());
        assert_eq!(names(&out), ["c", "z", "a"]);
    }

    #[test]
    fn pages_and_counts() {
        let out = run(queues(250), &[("page", "3"), ("page_size", "100")]).unwrap();
        assert_eq!(out["total_count"], 250);
        assert_eq!(out["filtered_count"], 250);
        assert_eq!(out["item_count"], 50);
        assert_eq!(out["page"], 3);
        assert_eq!(out["page_size"], 100);
        assert_eq!(out["page_count"], 3);
        assert_eq!(names(&out)[0], "q200");
        let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "filtered_count",
                "item_count",
                "items",
                "page",
                "page_count",
                "page_size",
                "total_count"
            ]
        );
    }

    #[test]
    fn default_page_size_is_100() {
        let out = run(queues(150), &[("page", "1")]).unwrap();
        assert_eq!(out["page_size"], 100);
        assert_eq!(out["item_count"], 100);
        assert_eq!(out["page_count"], 2);
    }

    #[test]
    fn the_page_after_the_last_is_empty_and_later_ones_are_out_of_range() {
        let out = run(queues(0), &[("page", "1")]).unwrap();
        assert_eq!(out["item_count"], 0);
        assert_eq!(out["page_count"], 0);
        let out = run(queues(10), &[("page", "2"), ("page_size", "10")]).unwrap();
        assert_eq!(out["items"], json!([]));
        let (code, body) = run(queues(10), &[("page", "3"), ("page_size", "10")]).unwrap_err();
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            json!({"error": "page_out_of_range",
                   "reason": "Page out of range, page: 3 page size: 10, len: 10"})
        );
    }

    #[test]
    fn bad_parameters_get_rabbitmqs_errors() {
        let err = |q: &[(&str, &str)]| run(queues(3), q).unwrap_err();
        assert_eq!(
            err(&[("page", "0")]).1,
            json!({"error": "invalid_pagination_parameters",
                   "reason": "Invalid pagination parameters: page number 0, page size undefined"})
        );
        assert_eq!(
            err(&[("page", "1"), ("page_size", "501")]).1["reason"],
            "Invalid pagination parameters: page number 1, page size 501"
        );
        assert_eq!(
            err(&[("page", "2"), ("page_size", "0")]).1["reason"],
            "Invalid pagination parameters: page number 2, page size 0"
        );
        assert_eq!(
            err(&[("page", "-1")]).1["error"],
            "invalid_pagination_parameters"
        );
        let invalid =
            json!({"error": "bad_request", "reason": "Pagination parameters are invalid"});
        assert_eq!(err(&[("page", "abc")]).1, invalid);
        assert_eq!(err(&[("page", "")]).1, invalid);
        assert_eq!(err(&[("page", "1"), ("page_size", "1.5")]).1, invalid);
        assert_eq!(err(&[("page", "99999999999999999999")]).1, invalid);
        let (code, body) = err(&[("page", "1"), ("name", "("), ("use_regex", "true")]);
        assert_eq!((code, body), (StatusCode::BAD_REQUEST, invalid));
        // page_size alone does not page, so it is not checked.
        assert!(run(queues(3), &[("page_size", "0")]).unwrap().is_array());
    }

    #[test]
    fn name_filters_by_substring_or_regex_case_insensitively() {
        let items = json!([
            {"vhost": "/", "name": "Orders.EU"}, {"vhost": "/", "name": "orders.us"},
            {"vhost": "/", "name": "billing"}, {"vhost": "/", "name": "ordersXeu"}
        ]);
        let out = run(items.clone(), &[("page", "1"), ("name", "ORDERS.")]).unwrap();
        assert_eq!(names(&out), ["Orders.EU", "orders.us"]);
        assert_eq!(out["filtered_count"], 2);
        assert_eq!(out["total_count"], 4);
        let out = run(
            items.clone(),
            &[
                ("page", "1"),
                ("name", r"^orders\.eu$"),
                ("use_regex", "true"),
            ],
        )
        .unwrap();
        assert_eq!(names(&out), ["Orders.EU"]);
        let out = run(
            items,
            &[("page", "1"), ("name", "ing|xeu"), ("use_regex", "true")],
        )
        .unwrap();
        assert_eq!(names(&out), ["billing", "ordersXeu"]);
    }

    #[test]
    fn sort_by_a_dotted_key_reversed_with_missing_values_as_zero() {
        let items = json!([
            {"vhost": "/", "name": "a", "message_stats": {"publish_details": {"rate": 2.5}}},
            {"vhost": "/", "name": "b"},
            {"vhost": "/", "name": "c", "message_stats": {"publish_details": {"rate": 10}}},
            {"vhost": "/", "name": "d", "message_stats": {"publish_details": {"rate": 0.0}}}
        ]);
        let sort = ("sort", "message_stats.publish_details.rate");
        let out = run(items.clone(), &[sort]).unwrap();
        assert_eq!(names(&out), ["b", "d", "a", "c"]);
        let out = run(items, &[sort, ("sort_reverse", "true")]).unwrap();
        assert_eq!(names(&out), ["c", "a", "d", "b"]);
    }

    #[test]
    fn sort_reverse_applies_before_the_page_is_cut() {
        let out = run(
            queues(12),
            &[
                ("page", "2"),
                ("page_size", "5"),
                ("sort", "name"),
                ("sort_reverse", "true"),
            ],
        )
        .unwrap();
        assert_eq!(names(&out), ["q006", "q005", "q004", "q003", "q002"]);
    }

    #[test]
    fn erlang_term_order_across_types() {
        let items = json!([
            {"name": "s", "k": "text"}, {"name": "t", "k": true}, {"name": "n", "k": null},
            {"name": "f", "k": false}, {"name": "num", "k": 3}, {"name": "l", "k": [1]},
            {"name": "o", "k": {"a": 1}}, {"name": "missing"}
        ]);
        let out = run(items, &[("sort", "k")]).unwrap();
        assert_eq!(
            names(&out),
            ["missing", "num", "f", "n", "t", "o", "l", "s"]
        );
    }

    #[test]
    fn an_empty_sort_is_the_default_sort() {
        let items =
            json!([{"vhost": "/", "name": "b", "x": 1}, {"vhost": "/", "name": "a", "x": 2}]);
        let out = run(items, &[("sort", ""), ("sort_reverse", "true")]).unwrap();
        assert_eq!(names(&out), ["b", "a"]);
    }
}
