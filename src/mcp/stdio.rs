//! `confine serve`'s stdio transport: rmcp's line transport, with a reader
//! in front of it that answers a line that is not JSON with a JSON-RPC
//! parse error (-32700; no id, as MCP's error responses leave out one
//! that can't be read), as JSON-RPC 2.0 asks. rmcp drops such a
//! line without a word (against an error storm with a peer that echoes
//! garbage back; our answer is valid JSON, which such a peer's echo then
//! is too, so no storm starts here), and a client that wrote a broken line
//! then waits for an answer that never comes.
//!
//! The reader only sorts lines: JSON goes on to rmcp byte for byte (rmcp
//! parses it, and answers well-formed JSON of the wrong shape itself), and
//! every answer is written by rmcp's writer, so no two writes interleave.

use rmcp::model::{ErrorData, JsonRpcMessage};
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use rmcp::transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};
use tokio::sync::mpsc;

/// Bytes of lines between the reader and rmcp (a pipe's worth).
const PIPE_BYTES: usize = 64 << 10;
/// Parse errors waiting to be sent: past them, a flood of garbage waits
/// (stdin is read no further) instead of growing a queue.
const PENDING_ERRORS: usize = 64;

/// rmcp's transport over the lines [`sort_lines`] lets through, and the
/// parse errors it sends for those it did not.
pub struct AnsweringTransport<W: AsyncWrite + Send + Unpin + 'static> {
    inner: AsyncRwTransport<RoleServer, DuplexStream, W>,
    unparsable: mpsc::Receiver<String>,
}

impl<W: AsyncWrite + Send + Unpin + 'static> AnsweringTransport<W> {
    /// Serve lines read from `input`, answers written to `output`. The
    /// reader runs as a task of its own until `input` ends.
    pub fn new<R: AsyncRead + Send + Unpin + 'static>(input: R, output: W) -> Self {
        let (to_rmcp, from_reader) = tokio::io::duplex(PIPE_BYTES);
        let (tx, unparsable) = mpsc::channel(PENDING_ERRORS);
        tokio::spawn(sort_lines(input, to_rmcp, tx, DEFAULT_MAX_LINE_LENGTH));
        AnsweringTransport { inner: AsyncRwTransport::new(from_reader, output), unparsable }
    }
}

impl<W: AsyncWrite + Send + Unpin + 'static> Transport<RoleServer> for AnsweringTransport<W> {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            // Both are cancel-safe (rmcp's keeps a partial line): this
            // future is polled in rmcp's `select!` and may be dropped.
            tokio::select! {
                biased;
                Some(why) = self.unparsable.recv() => {
                    let error = JsonRpcMessage::error(ErrorData::parse_error(why, None), None);
                    // Sent on its own: a reader cancelled meanwhile must not lose it.
                    let sending = self.inner.send(error);
                    tokio::spawn(async move {
                        if let Err(e) = sending.await {
                            tracing::debug!(error = %e, "cannot answer an unparsable line");
                        }
                    });
                }
                m = self.inner.receive() => return m,
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.inner.close().await
    }
}

/// Copy the lines of `input` that are JSON (or blank) to `out`; for each
/// other one, and each longer than `max` bytes (dropped unread, as rmcp
/// drops them), send why on `unparsable`. Ends with `input`, which
/// closes `out`: rmcp then ends the session.
async fn sort_lines<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    input: R,
    mut out: W,
    unparsable: mpsc::Sender<String>,
    max: usize,
) {
    let mut input = BufReader::new(input);
    let mut line = Vec::new();
    let mut too_long = false;
    loop {
        let buf = match input.fill_buf().await {
            Ok([]) => return,
            Ok(buf) => buf,
            Err(e) => {
                tracing::debug!(error = %e, "stdin: read failed; the session ends");
                return;
            }
        };
        let (chunk, ends) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (&buf[..=i], true),
            None => (buf, false),
        };
        let n = chunk.len();
        if !too_long && line.len() + n > max {
            too_long = true;
            line = Vec::new();
        }
        if !too_long {
            line.extend_from_slice(chunk);
        }
        input.consume(n);
        if !ends {
            continue;
        }
        let why = if std::mem::take(&mut too_long) {
            Some(format!("Parse error: a line longer than {max} bytes was dropped"))
        } else {
            not_json(&line)
        };
        match why {
            Some(why) => {
                tracing::debug!(%why, "stdin: an unparsable line");
                if unparsable.send(why).await.is_err() {
                    return;
                }
            }
            None => {
                if out.write_all(&line).await.is_err() {
                    return;
                }
            }
        }
        line.clear();
    }
}

/// Why `line` (with its newline) is not JSON, as the parser says; `None`
/// for JSON and for a blank line (skipped by rmcp). A byte-order mark and
/// a carriage return are allowed, as rmcp allows them.
fn not_json(line: &[u8]) -> Option<String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let line = line.strip_prefix("\u{feff}".as_bytes()).unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    match serde_json::from_slice::<serde::de::IgnoredAny>(line) {
        Ok(_) => None,
        Err(e) => Some(format!("Parse error: the line is not JSON ({e})")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn sorted(input: &'static [u8], max: usize) -> (String, Vec<String>) {
        let (mut rx_end, tx_end) = tokio::io::duplex(1 << 16);
        let (tx, mut rx) = mpsc::channel(16);
        sort_lines(input, tx_end, tx, max).await;
        let mut passed = String::new();
        rx_end.read_to_string(&mut passed).await.unwrap();
        let mut why = Vec::new();
        while let Ok(w) = rx.try_recv() {
            why.push(w);
        }
        (passed, why)
    }

    #[tokio::test]
    async fn json_passes_byte_for_byte_and_garbage_is_named() {
        let (passed, why) =
            sorted(b"{\"a\":1}\ngarbage\n\n{\"b\":\r\n\xef\xbb\xbf{\"c\":2}\r\n[1]\n{\"partial\"", 1 << 20).await;
        assert_eq!(passed, "{\"a\":1}\n\n\u{feff}{\"c\":2}\r\n[1]\n");
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(why.iter().all(|w| w.starts_with("Parse error: the line is not JSON")), "{why:?}");
    }

    #[tokio::test]
    async fn an_overlong_line_is_dropped_and_named() {
        let (passed, why) = sorted(b"{\"long\":\"xxxxxxxxxxxxxxxxxxxx\"}\n{}\n", 16).await;
        assert_eq!(passed, "{}\n");
        assert_eq!(why, vec!["Parse error: a line longer than 16 bytes was dropped".to_string()]);
    }
}
