//! The nginx example (deploy/nginx/) in front of a real replica: nginx asks
//! `GET /v1/admit` before every request (auth_request) and passes the
//! arbiter's 2xx, 429 and 503 through to the caller with `Retry-After` and the
//! RateLimit fields. Skipped, with a message, where nginx is not installed
//! (.ci/run installs Debian's). And the alerting rules of deploy/prometheus/,
//! checked by `promtool test rules` where promtool is installed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

use crate::helpers::{find_on_path, TestApp};

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy");

/// nginx running the example's server block in a directory of its own.
struct Gateway {
    base: String,
    dir: PathBuf,
    nginx: PathBuf,
}

impl Gateway {
    /// Starts nginx with deploy/nginx/admission.conf, its two upstreams
    /// pointed at `arbiter` and at a backend nginx serves itself.
    async fn start(nginx: PathBuf, arbiter: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("qa-gateway-{}", free_port()));
        std::fs::create_dir_all(dir.join("logs")).unwrap();
        let (front, backend) = (free_port(), free_port());
        let example = std::fs::read_to_string(format!("{DEPLOY}/nginx/admission.conf")).unwrap();
        let snippet = dir.join("quota-admit.conf");
        std::fs::copy(format!("{DEPLOY}/nginx/quota-admit.conf"), &snippet).unwrap();
        let example = replaced(
            &example,
            &[
                ("server 127.0.0.1:8080;", &format!("server {arbiter};")),
                (
                    "server 127.0.0.1:9000;",
                    &format!("server 127.0.0.1:{backend};"),
                ),
                ("listen 8000;", &format!("listen 127.0.0.1:{front};")),
                (
                    "/etc/nginx/snippets/quota-admit.conf",
                    &snippet.to_string_lossy(),
                ),
            ],
        );
        std::fs::write(dir.join("admission.conf"), example).unwrap();
        let d = dir.display();
        let main = format!(
            "worker_processes 1;\nerror_log {d}/logs/error.log;\npid {d}/nginx.pid;\n\
             events {{}}\nhttp {{\n  access_log off;\n\
             client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
             fastcgi_temp_path {d}/fastcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
             server {{ listen 127.0.0.1:{backend}; location / {{ return 200 \"api $uri\\n\"; }} }}\n\
             include {d}/admission.conf;\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), main).unwrap();
        let gateway = Self {
            base: format!("http://127.0.0.1:{front}"),
            dir,
            nginx,
        };
        let status = gateway.control(&[]).await;
        assert!(status, "nginx starts with the example configuration");
        gateway
    }

    /// Runs nginx on this directory's configuration (`-s stop` and the like).
    /// nginx on this gateway's prefix and configuration, with `args`.
    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut command = std::process::Command::new(&self.nginx);
        command
            .arg("-p")
            .arg(&self.dir)
            .arg("-c")
            .arg(self.dir.join("nginx.conf"))
            .args(args)
            .stdin(Stdio::null());
        command
    }

    async fn control(&self, args: &[&str]) -> bool {
        let output = tokio::process::Command::from(self.command(args))
            .output()
            .await
            .expect("nginx runs");
        if !output.status.success() {
            eprintln!("nginx: {}", String::from_utf8_lossy(&output.stderr));
        }
        output.status.success()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.command(&["-s", "stop"]).output();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn replaced(text: &str, pairs: &[(&str, &str)]) -> String {
    pairs.iter().fold(text.to_string(), |text, (from, to)| {
        assert!(text.contains(from), "the example still says `{from}`");
        text.replace(from, to)
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn nginx() -> Option<PathBuf> {
    find_on_path(&["nginx"]).or_else(|| {
        let sbin = Path::new("/usr/sbin/nginx");
        sbin.is_file().then(|| sbin.to_path_buf())
    })
}

async fn route_class(app: &TestApp, name: &str, profile: serde_json::Value) {
    let put = app
        .admin(reqwest::Method::PUT, &format!("/v1/route-classes/{name}"))
        .json(&profile)
        .send()
        .await
        .unwrap();
    assert!(
        put.status().is_success(),
        "PUT route class: {}",
        put.status()
    );
}

/// A request through the gateway as the example's demo caller `key` (or an
/// anonymous one): its status and the headers the caller sees.
async fn call(client: &reqwest::Client, url: &str, key: Option<&str>) -> reqwest::Response {
    let mut request = client.get(url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.expect("the gateway answers")
}

fn header(response: &reqwest::Response, name: &str) -> Option<String> {
    let value = response.headers().get(name)?;
    Some(value.to_str().unwrap().to_string())
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn nginx_passes_admission_answers_through_with_their_headers(pool: PgPool) {
    let Some(nginx) = nginx() else {
        eprintln!("SKIPPED gateway test: no nginx (.ci/run installs Debian's nginx)");
        return;
    };
    let app = TestApp::spawn(pool.clone()).await;
    // A caller's bucket of 2 that refills slowly; a class whose capacity
    // (3 a minute) the other tenant exhausts.
    let slow = json!({"burst": 2, "rate": 0.05, "capacity": 1000, "window_seconds": 60, "tenant_share": 1.0});
    route_class(&app, "public-apis", slow).await;
    let scarce = json!({"burst": 100, "rate": 100, "capacity": 3, "window_seconds": 60, "tenant_share": 1.0});
    route_class(&app, "partner-apis", scarce).await;
    let arbiter = app.base.trim_start_matches("http://").to_string();
    let gateway = Gateway::start(nginx, &arbiter).await;
    let client = reqwest::Client::new();

    // Admitted: the API answers, with the caller's own RateLimit fields.
    let public = format!("{}/orders", gateway.base);
    for _ in 0..2 {
        let admitted = call(&client, &public, Some("demo-key-acme-1")).await;
        assert_eq!(admitted.status(), StatusCode::OK);
        assert!(header(&admitted, "ratelimit-policy").is_some());
        assert!(header(&admitted, "ratelimit").is_some());
        assert_eq!(admitted.text().await.unwrap(), "api /orders\n");
    }
    // The caller's own bucket is empty: 429, Retry-After from its bucket.
    let limited = call(&client, &public, Some("demo-key-acme-1")).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = header(&limited, "retry-after")
        .expect("a 429 says when to retry")
        .parse()
        .unwrap();
    assert!((1..=20).contains(&retry_after), "retry after {retry_after}");
    let ratelimit = header(&limited, "ratelimit").expect("RateLimit on a 429");
    assert!(ratelimit.contains("r=0"), "{ratelimit}");
    assert!(
        ratelimit.contains(&format!("t={retry_after}")),
        "{ratelimit}"
    );
    assert!(header(&limited, "ratelimit-policy").is_some());
    let body = limited.text().await.unwrap();
    assert!(body.contains("caller-rate-limited"), "{body}");
    assert!(!body.contains("acme") && !body.contains("globex"), "{body}");
    // Another caller of the same class is not held back by the first.
    let other = call(&client, &public, Some("demo-key-globex-1")).await;
    assert_eq!(other.status(), StatusCode::OK);

    // The class's capacity is gone: 503 for everyone, not 429.
    let partner = format!("{}/partner/catalog", gateway.base);
    for _ in 0..3 {
        let admitted = call(&client, &partner, Some("demo-key-globex-1")).await;
        assert_eq!(admitted.status(), StatusCode::OK);
    }
    let exhausted = call(&client, &partner, Some("demo-key-acme-2")).await;
    assert_eq!(exhausted.status(), StatusCode::SERVICE_UNAVAILABLE);
    let retry_after = header(&exhausted, "retry-after").expect("a 503 says when to retry");
    assert!(retry_after.parse::<u64>().unwrap() <= 60);
    let body = exhausted.text().await.unwrap();
    assert!(body.contains("capacity-exhausted"), "{body}");

    // The arbiter gone: the gateway fails closed.
    drop(app);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let closed = call(&client, &public, None).await;
    assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body = closed.text().await.unwrap();
    assert!(body.contains("store-unavailable"), "{body}");
}

#[tokio::test]
async fn the_alerting_rules_fire_on_capacity_refusals_not_on_callers_own_limits() {
    let Some(promtool) = find_on_path(&["promtool"]) else {
        eprintln!("SKIPPED alerting rules: no promtool (.ci/run installs Debian's prometheus)");
        return;
    };
    let output = tokio::process::Command::new(promtool)
        .args(["test", "rules", "alerts.test.yml"])
        .current_dir(format!("{DEPLOY}/prometheus"))
        .output()
        .await
        .expect("promtool runs");
    assert!(
        output.status.success(),
        "promtool test rules: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
