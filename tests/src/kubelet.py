"""A kubelet's two health endpoints as kstall checks them, wedged or well as STATE_FILE says
("wedged" or "well", read on each connection): `GET /healthz` on one port (wedged: the request is
read and never answered), and a TLS server on another (wedged: it takes the connection and the
ClientHello and never answers, as incident 4's :10250 did).
Usage: kubelet.py CERT KEY STATE_FILE PORT_FILE [HEALTHZ_PORT TLS_PORT] -- on free ports unless
given; writes "HEALTHZ_PORT TLS_PORT" to PORT_FILE."""
import http.server
import os
import socket
import ssl
import sys
import threading

cert, key, state_file, port_file = sys.argv[1:5]
healthz_port, tls_port = (int(p) for p in sys.argv[5:7]) if len(sys.argv) > 5 else (0, 0)
held = []


def wedged():
    with open(state_file) as f:
        return f.read().strip() == "wedged"


class Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if wedged():
            held.append(self.connection)
            threading.Event().wait()
        body = b"ok"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


healthz = http.server.ThreadingHTTPServer(("127.0.0.1", healthz_port), Healthz)
healthz.daemon_threads = True
threading.Thread(target=healthz.serve_forever, daemon=True).start()

context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server = socket.create_server(("127.0.0.1", tls_port))


def handshake(conn):
    if wedged():
        conn.recv(4096)
        held.append(conn)
        return
    try:
        with context.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)
    except (ssl.SSLError, OSError):
        pass


with open(port_file + ".tmp", "w") as f:
    f.write(f"{healthz.server_address[1]} {server.getsockname()[1]}")
os.rename(port_file + ".tmp", port_file)
while True:
    conn, _ = server.accept()
    threading.Thread(target=handshake, args=(conn,), daemon=True).start()
