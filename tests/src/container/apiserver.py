"""The part of a Kubernetes API server that kstall uses, over TLS as in a cluster: the list of pods
(read from a JSON file on each request), a watch that stays open and quiet until the file changes
(then it expires with a 410 ERROR event, as after a compaction, and the client lists again), and
the writes of
events.k8s.io/v1 Events (create, merge patch), each appended to EVENTS_JSONL as one line
{"method", "path", "body", "code"}. A create is refused (422) as a real 1.20 API server refuses
it: a set deprecatedSource, or an Event about a cluster-scoped object outside kube-system.
Usage: apiserver.py PODS_JSON CERT KEY PORT_FILE EVENTS_JSONL -- writes the port it bound to
PORT_FILE."""
import http.server
import json
import os
import ssl
import sys
import threading

pods_path, cert, key, port_file, events_path = sys.argv[1:6]
stop = threading.Event()
written = threading.Lock()
EVENTS = "/apis/events.k8s.io/v1/namespaces/"


def invalid(path, event):
    """What validation of an events.k8s.io/v1 create (1.20) refuses of what kstall could send."""
    causes = []
    namespace = path[len(EVENTS):].split("/")[0]
    if not (event.get("regarding") or {}).get("namespace") and namespace != "kube-system":
        causes.append('involvedObject.namespace: Invalid value: "": does not match event.namespace')
    source = event.get("deprecatedSource") or {}
    if source.get("component") or source.get("host"):
        causes.append('source: Invalid value: "": needs to be unset')
    return causes


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        path, _, query = self.path.partition("?")
        params = dict(kv.split("=", 1) for kv in query.split("&") if "=" in kv)
        if path != "/api/v1/pods":
            return self.answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": "NotFound", "code": 404, "metadata": {}})
        if params.get("watch") in ("true", "1"):
            listed = os.stat(pods_path).st_mtime_ns
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            while not stop.wait(0.1):
                if os.stat(pods_path).st_mtime_ns != listed:
                    gone = {"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "Expired", "code": 410,
                            "message": "too old resource version"}}
                    line = (json.dumps(gone) + "\n").encode()
                    self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(line), line))
                    self.wfile.flush()
                    return
            return
        with open(pods_path) as f:
            items = json.load(f)["items"]
        self.answer(200, {"kind": "PodList", "apiVersion": "v1",
                          "metadata": {"resourceVersion": "1"}, "items": items})

    def do_POST(self):
        self.write(201 if self.path.partition("?")[0].endswith("/events") else 404)

    def do_PATCH(self):
        self.write(200 if "/events/" in self.path else 404)

    def write(self, code):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"null")
        path = self.path.partition("?")[0]
        if not path.startswith(EVENTS):
            code = 404
        causes = invalid(path, body) if self.command == "POST" and code == 201 else []
        if causes:
            code = 422
        with written, open(events_path, "a") as f:
            f.write(json.dumps({"method": self.command, "path": path, "body": body, "code": code}) + "\n")
        if code == 404:
            return self.answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": "NotFound", "code": 404, "metadata": {}})
        if code == 422:
            return self.answer(422, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": "Invalid", "code": 422, "metadata": {},
                                     "message": "Event is invalid: [" + ", ".join(causes) + "]"})
        # The object as stored; a patch answers with what it patched (enough for the client).
        self.answer(code, body)

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain(cert, key)
server.socket = context.wrap_socket(server.socket, server_side=True)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
