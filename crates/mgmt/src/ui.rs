//! The management web UI: static assets embedded in the binary, served without credentials
//! (the pages log in against the HTTP API with the user's name and password, as RabbitMQ's do).
//!
//! The assets live in `crates/mgmt/ui/` (plain HTML, CSS and JavaScript modules, no build
//! step, nothing fetched from elsewhere at run time). Each is answered with its content type,
//! `Cache-Control: no-cache` and an ETag computed at compile time, so a browser revalidates
//! with a 304 instead of keeping a UI older than the broker.

use std::sync::Arc;

use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use warren_broker::server::Broker;

/// One embedded file.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    etag: &'static str,
}

/// FNV-1a, 64 bits: the ETag of an asset, computed by the compiler.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
}

/// `"` + 16 hex digits + `"`, as a `&'static str` built at compile time.
const fn etag_bytes(bytes: &[u8]) -> [u8; 18] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let h = fnv1a(bytes);
    let mut out = [b'"'; 18];
    let mut i = 0;
    while i < 16 {
        out[1 + i] = HEX[((h >> (60 - 4 * i)) & 0xf) as usize];
        i += 1;
    }
    out
}

macro_rules! asset {
    ($path:literal, $file:literal, $content_type:expr) => {{
        const BODY: &[u8] = include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/ui/", $file));
        const ETAG: [u8; 18] = etag_bytes(BODY);
        Asset {
            path: $path,
            content_type: $content_type,
            body: BODY,
            etag: match std::str::from_utf8(&ETAG) {
                Ok(s) => s,
                Err(_) => panic!("an ETag is ASCII"),
            },
        }
    }};
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

static ASSETS: [Asset; 11] = [
    asset!("/", "index.html", HTML),
    asset!("/index.html", "index.html", HTML),
    asset!("/ui/app.js", "app.js", JS),
    asset!("/ui/chart.js", "chart.js", JS),
    asset!("/ui/core.js", "core.js", JS),
    asset!("/ui/list.js", "list.js", JS),
    asset!("/ui/bindings.js", "bindings.js", JS),
    asset!("/ui/nodes.js", "nodes.js", JS),
    asset!("/ui/shovels.js", "shovels.js", JS),
    asset!("/ui/app.css", "app.css", "text/css; charset=utf-8"),
    asset!("/ui/favicon.svg", "favicon.svg", "image/svg+xml"),
];

/// The pages' Content-Security-Policy: scripts, styles and API calls from this origin only, so
/// a name that slipped into markup could still run nothing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

fn serve(asset: &'static Asset, req: &HeaderMap) -> Response {
    let fresh = req
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim() == asset.etag || t.trim() == "*")
        });
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (StatusCode::OK, asset.body).into_response()
    };
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(header::ETAG, HeaderValue::from_static(asset.etag));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if asset.content_type == HTML {
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CSP),
        );
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    }
    r
}

/// A path under `/ui/` that is no asset: a plain 404, not the API's 401 (whose
/// `WWW-Authenticate` would make a browser ask for a password).
async fn missing() -> Response {
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "Not Found\n",
    )
        .into_response()
}

fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut r = Router::new();
    for asset in &ASSETS {
        r = r.route(
            asset.path,
            get(move |headers: HeaderMap| async move { serve(asset, &headers) }),
        );
    }
    r.route("/ui/{*rest}", get(missing))
}

/// The UI's routes (`/` and its assets).
pub fn routes() -> Router<Arc<Broker>> {
    router()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    async fn get_path(path: &str, etag: Option<&str>) -> Response {
        let mut req = Request::get(path);
        if let Some(e) = etag {
            req = req.header(header::IF_NONE_MATCH, e);
        }
        router::<()>()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    fn content_type(r: &Response) -> &str {
        r.headers()[header::CONTENT_TYPE].to_str().unwrap()
    }

    #[tokio::test]
    async fn serves_each_asset_with_its_type() {
        for (path, ct) in [
            ("/", HTML),
            ("/index.html", HTML),
            ("/ui/app.js", JS),
            ("/ui/chart.js", JS),
            ("/ui/core.js", JS),
            ("/ui/list.js", JS),
            ("/ui/bindings.js", JS),
            ("/ui/nodes.js", JS),
            ("/ui/app.css", "text/css; charset=utf-8"),
            ("/ui/favicon.svg", "image/svg+xml"),
        ] {
            let r = get_path(path, None).await;
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            assert_eq!(content_type(&r), ct, "{path}");
            assert_eq!(r.headers()[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
        }
        let r = get_path("/", None).await;
        assert!(r.headers().contains_key(header::CONTENT_SECURITY_POLICY));
    }

    #[tokio::test]
    async fn etag_revalidates() {
        let r = get_path("/ui/app.js", None).await;
        let etag = r.headers()[header::ETAG].to_str().unwrap().to_string();
        assert_eq!(etag.len(), 18);
        let r = get_path("/ui/app.js", Some(&etag)).await;
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
        let r = get_path("/ui/app.js", Some("\"0000000000000000\"")).await;
        assert_eq!(r.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn unknown_ui_path_is_a_plain_404() {
        let r = get_path("/ui/nope.js", None).await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert!(!r.headers().contains_key(header::WWW_AUTHENTICATE));
    }

    #[test]
    fn assets_are_self_contained() {
        // Nothing may be loaded from another origin (no CDN, no network at run time).
        for a in &ASSETS {
            let text = String::from_utf8_lossy(a.body);
            for needle in [
                "http://",
                "https://",
                "//cdn",
                "innerHTML",
                "outerHTML",
                "eval(",
            ] {
                let hits = text.matches(needle).count();
                let allowed = if needle == "http://" {
                    text.matches("http://www.w3.org/").count()
                } else {
                    0
                };
                assert_eq!(hits, allowed, "{} contains {needle}", a.path);
            }
        }
    }
}
