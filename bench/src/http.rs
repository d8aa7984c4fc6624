//! The load generator's HTTP/1.1 client: one kept-alive connection per
//! caller, each request written and its answer read by hand. The bench
//! shares two cores with the service and the database, so what it spends on
//! a request is taken from what it measures: with reqwest the bench process
//! spent about 36 µs of CPU per request, more than the service (10–20 µs an
//! answer) and the database together, while pgbench, which drives the
//! baselines, is lean C.

use std::fmt::Write;
use std::io;

use anyhow::Context;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

/// Connections to one service, one per caller, opened on first use.
pub struct Client {
    /// `host:port`.
    addr: String,
    connections: Vec<Mutex<Option<Connection>>>,
}

/// An answer: its status and its body.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    /// A 2xx answer; anything else is an error naming the status and body.
    pub fn success(&self) -> anyhow::Result<&Self> {
        anyhow::ensure!(
            (200..300).contains(&self.status),
            "HTTP {}: {}",
            self.status,
            String::from_utf8_lossy(&self.body)
        );
        Ok(self)
    }

    /// The body of a 2xx answer as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> anyhow::Result<T> {
        Ok(serde_json::from_slice(&self.success()?.body)?)
    }
}

impl Client {
    /// A client of the service at `base` (`http://host:port`) for `callers`
    /// callers, numbered from 0.
    pub fn new(base: &str, callers: usize) -> anyhow::Result<Self> {
        let addr = base
            .strip_prefix("http://")
            .with_context(|| format!("not an http:// address: {base}"))?;
        Ok(Self {
            addr: addr.trim_end_matches('/').to_string(),
            connections: (0..callers).map(|_| Mutex::new(None)).collect(),
        })
    }

    pub async fn get(
        &self,
        caller: usize,
        path: &str,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<Response> {
        self.send(caller, "GET", path, headers, None).await
    }

    pub async fn post_json(
        &self,
        caller: usize,
        path: &str,
        body: &impl Serialize,
    ) -> anyhow::Result<Response> {
        let body = serde_json::to_vec(body)?;
        self.send(caller, "POST", path, &[], Some(&body)).await
    }

    async fn send(
        &self,
        caller: usize,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> anyhow::Result<Response> {
        // Written into one buffer (one write, no allocation per header).
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        for (name, value) in headers {
            let _ = write!(request, "{name}: {value}\r\n");
        }
        if body.is_some() {
            request.push_str("Content-Type: application/json\r\n");
        }
        let length = body.map_or(0, <[u8]>::len);
        let _ = write!(request, "Content-Length: {length}\r\n\r\n");
        let mut request = request.into_bytes();
        request.extend_from_slice(body.unwrap_or_default());

        let slot = self
            .connections
            .get(caller)
            .with_context(|| format!("no connection for caller {caller}"))?;
        let mut slot = slot.lock().await;
        // A kept-alive connection the service closed meanwhile fails before
        // any answer: the request is sent again on a new one, once.
        if let Some(connection) = slot.as_mut() {
            match connection.exchange(&request).await {
                Ok(response) => return Ok(response),
                Err(Exchange::Unanswered(_)) => *slot = None,
                Err(Exchange::Broken(error)) => {
                    *slot = None;
                    return Err(error.into());
                }
            }
        }
        let stream = TcpStream::connect(&self.addr)
            .await
            .with_context(|| format!("connecting to {}", self.addr))?;
        stream.set_nodelay(true)?;
        let connection = slot.insert(Connection {
            stream: BufReader::new(stream),
            line: String::new(),
        });
        match connection.exchange(&request).await {
            Ok(response) => Ok(response),
            Err(Exchange::Unanswered(error) | Exchange::Broken(error)) => {
                *slot = None;
                Err(error.into())
            }
        }
    }
}

struct Connection {
    stream: BufReader<TcpStream>,
    line: String,
}

/// Why an exchange failed: before any of the answer was read (the request
/// may be sent again), or after.
enum Exchange {
    Unanswered(io::Error),
    Broken(io::Error),
}

impl Connection {
    async fn exchange(&mut self, request: &[u8]) -> Result<Response, Exchange> {
        let status = self.write_and_read_status(request).await;
        let status = status.map_err(Exchange::Unanswered)?;
        self.read_rest(status).await.map_err(Exchange::Broken)
    }

    async fn write_and_read_status(&mut self, request: &[u8]) -> io::Result<u16> {
        self.stream.get_mut().write_all(request).await?;
        self.line.clear();
        if self.stream.read_line(&mut self.line).await? == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let status = self.line.split(' ').nth(1).and_then(|s| s.parse().ok());
        status.ok_or_else(|| invalid(format!("not a status line: {:?}", self.line)))
    }

    /// The headers and the body (by its length, or chunked).
    async fn read_rest(&mut self, status: u16) -> io::Result<Response> {
        let (mut length, mut chunked) = (None, false);
        loop {
            self.line.clear();
            if self.stream.read_line(&mut self.line).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let header = self.line.trim_end();
            if header.is_empty() {
                break;
            }
            let Some((name, value)) = header.split_once(':') else {
                return Err(invalid(format!("not a header: {header:?}")));
            };
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                length = Some(value.parse().map_err(|_| invalid("content-length"))?);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value.eq_ignore_ascii_case("chunked");
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                self.line.clear();
                self.stream.read_line(&mut self.line).await?;
                let size = self.line.trim_end().split(';').next().unwrap_or_default();
                let size = usize::from_str_radix(size, 16).map_err(|_| invalid("chunk size"))?;
                let start = body.len();
                body.resize(start + size, 0);
                self.stream.read_exact(&mut body[start..]).await?;
                let mut end = [0; 2];
                self.stream.read_exact(&mut end).await?;
                if size == 0 {
                    break;
                }
            }
        } else if let Some(length) = length {
            body.resize(length, 0);
            self.stream.read_exact(&mut body).await?;
        }
        Ok(Response { status, body })
    }
}

fn invalid(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    use tokio::net::{TcpListener, TcpStream};

    use super::Client;

    /// Reads one request (its head and a body of its Content-Length) and
    /// answers `answer`; `false` when the client closed the connection.
    async fn answer_one(stream: &mut BufReader<TcpStream>, answer: &str) -> bool {
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            if stream.read_line(&mut line).await.unwrap() == 0 {
                return false;
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap();
            }
            if line == "\r\n" {
                break;
            }
        }
        let mut body = vec![0; length];
        stream.read_exact(&mut body).await.unwrap();
        stream.get_mut().write_all(answer.as_bytes()).await.unwrap();
        true
    }

    #[tokio::test]
    async fn answers_are_read_by_length_and_by_chunks_on_one_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            let mut stream = BufReader::new(listener.accept().await.unwrap().0);
            let sized = "HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{\"ok\": true }";
            let chunked = "HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\nb\r\nstore: gone\r\n1\r\n!\r\n0\r\n\r\n";
            let empty = "HTTP/1.1 204 No Content\r\n\r\n";
            let mut answered = 0;
            for answer in [sized, chunked, empty] {
                answered += usize::from(answer_one(&mut stream, answer).await);
            }
            answered
        });
        let client = Client::new(&base, 1).unwrap();
        let sized = client.post_json(0, "/v1/reserve", &"x").await.unwrap();
        assert_eq!(
            (sized.status, sized.body.as_slice()),
            (200, &b"{\"ok\": true }"[..])
        );
        let chunked = client.get(0, "/", &[("X-A", "b")]).await.unwrap();
        assert_eq!(
            (chunked.status, chunked.body.as_slice()),
            (503, &b"store: gone!"[..])
        );
        let empty = client.get(0, "/", &[]).await.unwrap();
        assert_eq!((empty.status, empty.body.len()), (204, 0));
        assert_eq!(server.await.unwrap(), 3, "three answers on one connection");
    }

    #[tokio::test]
    async fn a_connection_the_service_closed_is_opened_again_and_the_request_resent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
        let server = tokio::spawn(async move {
            // The first connection answers once and closes; the second answers.
            let mut first = BufReader::new(listener.accept().await.unwrap().0);
            assert!(answer_one(&mut first, ok).await);
            drop(first);
            let mut second = BufReader::new(listener.accept().await.unwrap().0);
            answer_one(&mut second, ok).await
        });
        let client = Client::new(&base, 1).unwrap();
        for _ in 0..2 {
            let response = client.get(0, "/healthz", &[]).await.unwrap();
            assert_eq!(
                (response.status, response.body.as_slice()),
                (200, &b"ok"[..])
            );
        }
        assert!(server.await.unwrap());
    }
}
