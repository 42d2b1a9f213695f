//! Just enough of TLS to read a ClientHello's server name: the proxy
//! holds a CONNECT tunnel to 443 until the client's first flight shows
//! which name it is talking to, and cuts it when that is not the name the
//! tunnel was opened for (domain fronting through an allowed address).
//!
//! The bytes come from the job: every length is checked against what was
//! read, and nothing here allocates more than the record layer carries.

/// Largest first flight the proxy waits for: a ClientHello with a
/// post-quantum key share is about 1.8 KiB; TLS caps a handshake
/// message's records at 16 KiB each, and this allows a few.
pub const MAX_HELLO: usize = 64 * 1024;

/// Most records a ClientHello may span.
const MAX_RECORDS: usize = 16;
const RECORD_HANDSHAKE: u8 = 22;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const EXT_SERVER_NAME: u16 = 0;
/// draft-ietf-tls-esni: encrypted_client_hello.
const EXT_ECH: u16 = 0xfe0d;

/// What the first flight says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The `host_name` of the server_name extension, if any.
    pub sni: Option<String>,
    /// It carries an encrypted ClientHello (its SNI is then the outer, public one).
    pub ech: bool,
}

/// The result of looking at the bytes read so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse {
    /// More bytes are needed.
    Incomplete,
    Hello(Hello),
    /// Not a TLS ClientHello.
    NotTls(&'static str),
}

/// Parse the start of a TLS stream: the handshake records' fragments put
/// together until the ClientHello is whole.
pub fn parse(buf: &[u8]) -> Parse {
    let mut handshake = Vec::new();
    let mut at = 0;
    let mut records = 0;
    loop {
        // Real clients send a ClientHello in one record, or a few: a
        // hello in many tiny ones is work for us (parsed again at every
        // read) and for no one else.
        records += 1;
        if records > MAX_RECORDS {
            return Parse::NotTls("a ClientHello split in too many records");
        }
        let Some(header) = buf.get(at..at + 5) else { return Parse::Incomplete };
        if header[0] != RECORD_HANDSHAKE {
            return Parse::NotTls("the first record is not a TLS handshake");
        }
        if header[1] != 3 {
            return Parse::NotTls("not a TLS record version");
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > 16 * 1024 + 256 {
            return Parse::NotTls("a TLS record of impossible length");
        }
        let Some(body) = buf.get(at + 5..at + 5 + len) else { return Parse::Incomplete };
        handshake.extend_from_slice(body);
        at += 5 + len;
        if handshake.len() >= 4 {
            if handshake[0] != HANDSHAKE_CLIENT_HELLO {
                return Parse::NotTls("the first handshake message is not a ClientHello");
            }
            let want =
                4 + (usize::from(handshake[1]) << 16 | usize::from(handshake[2]) << 8 | usize::from(handshake[3]));
            if want > MAX_HELLO {
                return Parse::NotTls("a ClientHello longer than the proxy reads");
            }
            if handshake.len() >= want {
                return match client_hello(&handshake[4..want]) {
                    Some(hello) => Parse::Hello(hello),
                    None => Parse::NotTls("a malformed ClientHello"),
                };
            }
        }
        if at >= MAX_HELLO {
            return Parse::NotTls("a ClientHello longer than the proxy reads");
        }
    }
}

/// Where the complete records that start at `from` end: the first
/// flight needs parsing again only when this moves (a record completed),
/// not at every read of a client that sends its hello a byte at a time.
pub fn complete_records(buf: &[u8], from: usize) -> usize {
    let mut at = from;
    while let Some(header) = buf.get(at..at + 5) {
        let end = at + 5 + usize::from(u16::from_be_bytes([header[3], header[4]]));
        if end > buf.len() {
            break;
        }
        at = end;
    }
    at
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, tail) = (self.buf.get(..n)?, self.buf.get(n..)?);
        self.buf = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(n)
    }
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(n)
    }
}

fn client_hello(body: &[u8]) -> Option<Hello> {
    let mut r = Reader { buf: body };
    r.take(2)?; // legacy_version
    r.take(32)?; // random
    r.vec8()?; // legacy_session_id
    r.vec16()?; // cipher_suites
    r.vec8()?; // legacy_compression_methods
    let mut hello = Hello { sni: None, ech: false };
    if r.buf.is_empty() {
        return Some(hello); // no extensions at all
    }
    let mut exts = Reader { buf: r.vec16()? };
    let mut seen_sni = false;
    while !exts.buf.is_empty() {
        let kind = exts.u16()? as u16;
        let data = exts.vec16()?;
        match kind {
            EXT_SERVER_NAME => {
                // Two server_name extensions: a client and a server could
                // each believe a different one.
                if seen_sni {
                    return None;
                }
                seen_sni = true;
                hello.sni = server_name(data)?;
            }
            EXT_ECH => hello.ech = true,
            _ => {}
        }
    }
    Some(hello)
}

/// The one `host_name` of a server_name extension. More than one, an
/// entry of another kind, or a name that is not plain ASCII makes the
/// hello malformed.
fn server_name(data: &[u8]) -> Option<Option<String>> {
    let mut r = Reader { buf: data };
    let mut list = Reader { buf: r.vec16()? };
    if !r.buf.is_empty() {
        return None;
    }
    let mut name = None;
    while !list.buf.is_empty() {
        let kind = list.u8()?;
        let value = list.vec16()?;
        // host_name is the only kind there is (RFC 6066): another one
        // beside it is a second name some parser might take instead.
        if kind != 0 || name.is_some() {
            return None;
        }
        let text = std::str::from_utf8(value).ok()?;
        // Printable ASCII only: the name is shown to the operator.
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) {
            return None;
        }
        name = Some(text.to_string());
    }
    Some(name)
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A minimal ClientHello: `sni` as its server name (none: no
    /// extension), an ECH extension when asked, split into records of at
    /// most `record` bytes.
    pub fn client_hello_bytes(sni: Option<&str>, ech: bool, record: usize) -> Vec<u8> {
        let mut exts = Vec::new();
        if let Some(name) = sni {
            let mut entry = vec![0u8];
            entry.extend_from_slice(&(name.len() as u16).to_be_bytes());
            entry.extend_from_slice(name.as_bytes());
            let mut data = (entry.len() as u16).to_be_bytes().to_vec();
            data.extend_from_slice(&entry);
            exts.extend_from_slice(&0u16.to_be_bytes());
            exts.extend_from_slice(&(data.len() as u16).to_be_bytes());
            exts.extend_from_slice(&data);
        }
        if ech {
            exts.extend_from_slice(&0xfe0du16.to_be_bytes());
            exts.extend_from_slice(&3u16.to_be_bytes());
            exts.extend_from_slice(&[0, 0, 0]);
        }
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7u8; 32]);
        body.push(0);
        body.extend_from_slice(&[0, 2, 0x13, 0x01]);
        body.extend_from_slice(&[1, 0]);
        body.extend_from_slice(&(exts.len() as u16).to_be_bytes());
        body.extend_from_slice(&exts);
        let mut hs = vec![1, 0];
        hs.extend_from_slice(&(body.len() as u16).to_be_bytes());
        hs.extend_from_slice(&body);
        let mut out = Vec::new();
        for chunk in hs.chunks(record) {
            out.extend_from_slice(&[22, 3, 1]);
            out.extend_from_slice(&(chunk.len() as u16).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    #[test]
    fn reads_the_server_name_across_records_and_byte_by_byte() {
        for record in [16 * 1024, 200, 64] {
            let bytes = client_hello_bytes(Some("registry.example.org"), false, record);
            let want = Parse::Hello(Hello { sni: Some("registry.example.org".into()), ech: false });
            assert_eq!(parse(&bytes), want);
            for cut in 0..bytes.len() {
                assert_eq!(parse(&bytes[..cut]), Parse::Incomplete, "cut at {cut} of {}", bytes.len());
            }
        }
    }

    #[test]
    fn a_hello_in_many_tiny_records_is_refused() {
        let bytes = client_hello_bytes(Some("registry.example.org"), false, 1);
        assert_eq!(parse(&bytes), Parse::NotTls("a ClientHello split in too many records"));
    }

    #[test]
    fn sees_ech_and_a_missing_name() {
        assert_eq!(parse(&client_hello_bytes(None, true, 512)), Parse::Hello(Hello { sni: None, ech: true }));
        assert_eq!(parse(&client_hello_bytes(None, false, 512)), Parse::Hello(Hello { sni: None, ech: false }));
    }

    #[test]
    fn refuses_what_is_not_a_client_hello() {
        assert!(matches!(parse(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), Parse::NotTls(_)));
        assert!(matches!(parse(b"CONNECT other:443 HTTP/1.1\r\n\r\n"), Parse::NotTls(_)));
        assert!(matches!(parse(&[22, 3, 1, 0, 0]), Parse::NotTls(_)));
        // A handshake message that says it is longer than the proxy reads.
        assert!(matches!(parse(&[22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff]), Parse::NotTls(_)));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let good = client_hello_bytes(Some("x.example"), true, 40);
        for _ in 0..20_000 {
            let mut bytes = good.clone();
            for _ in 0..4 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let i = (seed as usize) % bytes.len();
                bytes[i] = (seed >> 32) as u8;
            }
            let cut = (seed as usize >> 8) % (bytes.len() + 1);
            let _ = parse(&bytes[..cut]);
        }
    }

    /// A server_name list with the host name and a second entry of another
    /// kind: a parser that takes the first entry whatever its kind would see
    /// another name than ours (red team, finding F6).
    #[test]
    fn a_server_name_entry_of_another_kind_is_refused() {
        let good = client_hello_bytes(Some("app.test"), false, 16 * 1024);
        // The list is the last extension: append an entry of kind 1 to it.
        let mut entry = vec![1u8];
        entry.extend_from_slice(&9u16.to_be_bytes());
        entry.extend_from_slice(b"evil.test");
        let name_ext = good.windows(2 + 2 + 2 + 1 + 2 + 8).position(|w| w.ends_with(b"app.test")).unwrap();
        let mut hs = good[5..].to_vec();
        let at = name_ext - 5;
        // Lengths to grow: the extension's data (at+2), the list (at+4),
        // the extensions block, the handshake message and the record.
        let grow = |b: &mut [u8], i: usize| {
            let v = u16::from_be_bytes([b[i], b[i + 1]]) + entry.len() as u16;
            b[i..i + 2].copy_from_slice(&v.to_be_bytes());
        };
        grow(&mut hs, at + 2);
        grow(&mut hs, at + 4);
        grow(&mut hs, at - 2);
        grow(&mut hs, 2);
        hs.extend_from_slice(&entry);
        let mut bytes = vec![22, 3, 1];
        bytes.extend_from_slice(&(hs.len() as u16).to_be_bytes());
        bytes.extend_from_slice(&hs);
        assert_eq!(parse(&bytes), Parse::NotTls("a malformed ClientHello"));
    }

    #[test]
    fn complete_records_moves_only_when_a_record_completes() {
        let bytes = client_hello_bytes(Some("app.test"), false, 20);
        let mut ends = Vec::new();
        for cut in 0..=bytes.len() {
            ends.push(complete_records(&bytes[..cut], 0));
        }
        // Each end is a record boundary, and it moves once per record.
        let mut distinct = ends.clone();
        distinct.dedup();
        assert_eq!(distinct.len(), bytes.len().div_ceil(25) + 1, "{distinct:?}");
        assert_eq!(complete_records(&bytes, 0), bytes.len());
        assert_eq!(complete_records(&bytes, 25), bytes.len());
    }
}
