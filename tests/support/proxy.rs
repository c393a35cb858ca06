//! A fault-injecting TCP proxy for tests: it forwards loopback connections to a broker and,
//! when told, stalls them (bytes stop flowing both ways, the sockets stay open: a hung
//! network path) or cuts them (every open connection is shut at once: a dropped link).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const PASS: u8 = 0;
const STALL: u8 = 1;

pub struct Proxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stopped: Arc<AtomicBool>,
    accepting: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// Listen on a free loopback port and forward every connection to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        Proxy::start_on(0, upstream)
    }

    /// Listen on loopback `port` (a broker advertises it) and forward to `upstream`; the port
    /// is free again once the proxy is dropped.
    pub fn start_on(port: u16, upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap_or_else(|e| panic!("proxy on port {port}: {e}"));
        let port = listener.local_addr().unwrap().port();
        let mode = Arc::new(AtomicU8::new(PASS));
        let open = Arc::new(Mutex::new(Vec::new()));
        let stopped = Arc::new(AtomicBool::new(false));
        let (accept_mode, accept_open, accept_stopped) = (mode.clone(), open.clone(), stopped.clone());
        let accepting = std::thread::spawn(move || {
            for client in listener.incoming() {
                if accept_stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let Ok(server) = TcpStream::connect(upstream) else { continue };
                let mut open = accept_open.lock().unwrap();
                open.push(client.try_clone().unwrap());
                open.push(server.try_clone().unwrap());
                pump(client.try_clone().unwrap(), server.try_clone().unwrap(), accept_mode.clone());
                pump(server, client, accept_mode.clone());
            }
        });
        Proxy { port, mode, open, stopped, accepting: Some(accepting) }
    }

    /// Stop forwarding bytes; connections stay open and silent.
    pub fn stall(&self) {
        self.mode.store(STALL, Ordering::SeqCst);
    }

    /// Forward again (new connections always pass).
    pub fn pass(&self) {
        self.mode.store(PASS, Ordering::SeqCst);
    }

    /// Shut every connection open now, both ways.
    pub fn cut(&self) {
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    /// Stop listening (a last connection wakes the accepting thread) and close what is open.
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(accepting) = self.accepting.take() {
            let _ = accepting.join();
        }
        self.cut();
    }
}

/// Copy `from` to `to` until either side closes, holding the bytes while stalled.
fn pump(mut from: TcpStream, mut to: TcpStream, mode: Arc<AtomicU8>) {
    from.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        loop {
            if mode.load(Ordering::SeqCst) == STALL {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
