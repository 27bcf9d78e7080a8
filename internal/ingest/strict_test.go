package ingest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/spool"
)

// rawConn is a client connection that writes raw bytes and reads answers.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Bounds every read of the test: a server that neither answers nor
	// closes fails it instead of hanging it.
	c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) write(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// answer reads one response, nil at EOF (the server closed the connection).
func (rc *rawConn) answer() *http.Response {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.br, nil)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return nil
	}
	if err != nil {
		rc.t.Fatalf("read answer: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("read answer body: %v", err)
	}
	resp.Body.Close()
	resp.Body = io.NopCloser(strings.NewReader(string(b)))
	return resp
}

func bodyOf(r *http.Response) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// post returns a raw POST /2/httpapi with the given extra header lines (each
// ending in CRLF) and body, framed by Content-Length unless the header lines
// frame it.
func rawPost(lines, body string) string {
	if !strings.Contains(strings.ToLower(lines), "content-length") && !strings.Contains(strings.ToLower(lines), "transfer-encoding") {
		lines += fmt.Sprintf("Content-Length: %d\r\n", len(body))
	}
	return "POST /2/httpapi HTTP/1.1\r\nHost: relay\r\n" + lines + "\r\n" + body
}

// TestStrictFraming: framing faults fasthttp would accept get 400 and a
// closed connection, and whatever follows on the connection is never read:
// a request smuggled behind a chunked body is not ingested.
func TestStrictFraming(t *testing.T) {
	smuggled := string(envelope("smuggled-key", "", `{"user_id":"user-smuggled","event_type":"a"}`))
	next := rawPost("", smuggled) // a well-formed request pipelined behind
	good := string(envelope("good-key", "", `{"user_id":"user-00001","event_type":"a"}`))
	for _, tc := range []struct {
		name    string
		req     string
		wantMsg string
	}{
		{"content-length then transfer-encoding",
			"POST /2/httpapi HTTP/1.1\r\nHost: relay\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next,
			"Content-Length with Transfer-Encoding"},
		{"transfer-encoding then content-length",
			"POST /2/httpapi HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n" + next,
			"Content-Length with Transfer-Encoding"},
		{"chunked body holding an envelope, with content-length",
			fmt.Sprintf("POST /2/httpapi HTTP/1.1\r\nHost: relay\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(good), good) + next,
			"Content-Length with Transfer-Encoding"},
		{"obs-fold (space)", rawPost("X-Note: a\r\n b\r\n", good) + next, "Obsolete header line folding"},
		{"obs-fold (tab)", rawPost("User-Agent: sdk\r\n\tv1\r\n", good) + next, "Obsolete header line folding"},
		{"two content-encodings", rawPost("Content-Encoding: identity\r\nContent-Encoding: gzip\r\n", good) + next, "Repeated Content-Encoding"},
		{"repeated content-encoding", rawPost("Content-Encoding: gzip\r\ncontent-encoding: gzip\r\n", good) + next, "Repeated Content-Encoding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRelay(t, Config{}, spool.Config{NoSync: true})
			rc := dialRaw(t, r.addr)
			rc.write(tc.req)
			a := rc.answer()
			if a == nil {
				t.Fatal("connection closed without an answer")
			}
			if body := bodyOf(a); a.StatusCode != 400 || !strings.Contains(body, tc.wantMsg) {
				t.Fatalf("answer %d %s, want 400 %q", a.StatusCode, body, tc.wantMsg)
			}
			if !a.Close {
				t.Error("answer without Connection: close")
			}
			if a2 := rc.answer(); a2 != nil {
				t.Fatalf("a second answer on the connection: %d %s", a2.StatusCode, bodyOf(a2))
			}
			if n := r.counter("relay_ingest_events_accepted_total"); n != 0 {
				t.Fatalf("%v events accepted", n)
			}
		})
	}

	// The control: the same bytes without the fault are two requests, both
	// answered on one connection, and their events are spooled.
	t.Run("control", func(t *testing.T) {
		r := startRelay(t, Config{}, spool.Config{NoSync: true})
		rc := dialRaw(t, r.addr)
		rc.write(fmt.Sprintf("POST /2/httpapi HTTP/1.1\r\nHost: relay\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\nX-Note: a b\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(gz(t, []byte(good))), gz(t, []byte(good))) + next)
		for i := range 2 {
			if a := rc.answer(); a == nil || a.StatusCode != 200 {
				t.Fatalf("answer %d: %v", i, a)
			}
		}
		if n := r.counter("relay_ingest_events_accepted_total"); n != 2 {
			t.Fatalf("%v events accepted, want 2", n)
		}
	})
}

// TestExpectContinue: a body announced too large is refused with 413 before
// the client sends it (no 100 Continue); one within the limit gets 100
// Continue and is served.
func TestExpectContinue(t *testing.T) {
	const limit = 1000
	r := startRelay(t, Config{MaxRequestBytes: limit}, spool.Config{NoSync: true})
	good := string(envelope("good-key", "", `{"user_id":"user-00001","event_type":"a"}`))

	for _, tc := range []struct {
		name  string
		lines string
		want  int
	}{
		{"plain above the limit", "Content-Length: 1001\r\n", 413},
		{"plain far above the limit", "Content-Length: 30000000000\r\n", 413},
		{"gzip above the read limit", fmt.Sprintf("Content-Encoding: gzip\r\nContent-Length: %d\r\n", r.srv.readLimit+1), 413},
		{"with a framing fault", "Content-Length: 10\r\nTransfer-Encoding: chunked\r\n", 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rc := dialRaw(t, r.addr)
			rc.write("POST /2/httpapi HTTP/1.1\r\nHost: relay\r\nExpect: 100-continue\r\n" + tc.lines + "\r\n")
			a := rc.answer()
			if a == nil {
				t.Fatal("connection closed without an answer")
			}
			if a.StatusCode != tc.want {
				t.Fatalf("first answer %d %s, want %d (no 100 Continue)", a.StatusCode, bodyOf(a), tc.want)
			}
			if tc.want == 413 && !strings.Contains(bodyOf(a), "Payload too large") {
				t.Fatalf("413 body %q", bodyOf(a))
			}
			if a2 := rc.answer(); a2 != nil {
				t.Fatalf("a second answer: %d", a2.StatusCode)
			}
		})
	}

	t.Run("within the limit", func(t *testing.T) {
		rc := dialRaw(t, r.addr)
		rc.write(fmt.Sprintf("POST /2/httpapi HTTP/1.1\r\nHost: relay\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n", len(good)))
		if a := rc.answer(); a == nil || a.StatusCode != 100 {
			t.Fatalf("first answer %v, want 100 Continue", a)
		}
		rc.write(good)
		if a := rc.answer(); a == nil || a.StatusCode != 200 {
			t.Fatalf("answer %v, want 200", a)
		}
	})
}

func TestCheckHead(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want int
	}{
		{"", headOK},
		{"Host: a\r\n\r\n", headOK},
		{"Host: a\nContent-Length: 3\n\n", headOK},
		{"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", headCLWithTE},
		{"TRANSFER-ENCODING: chunked\r\nCONTENT-LENGTH: 3\r\n\r\n", headCLWithTE},
		{"Transfer-Encoding: chunked\r\n\r\nContent-Length: 3\r\n", headOK}, // after the head: body bytes
		{"A: b\r\n c\r\n\r\n", headObsFold},
		{"A: b\r\n\tc\r\n\r\n", headObsFold},
		{"Content-Encoding: gzip\r\nContent-Encoding: gzip\r\n\r\n", headRepeatedCE},
		{"Content-Encoding: gzip\r\nX-Content-Encoding: br\r\n\r\n", headOK},
		{"Content-Encodings: gzip\r\nContent-Encoding: gzip\r\n\r\n", headOK},
		{"no colon\r\n\r\n", headOK},
	} {
		if got := checkHead([]byte(tc.raw)); got != tc.want {
			t.Errorf("checkHead(%q) = %d, want %d", tc.raw, got, tc.want)
		}
	}
}

func BenchmarkCheckHead(b *testing.B) {
	raw := []byte("Host: relay.example.com\r\nUser-Agent: amplitude-node/1.3.6\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\nAccept: */*\r\nContent-Length: 4211\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n")
	b.ReportAllocs()
	for b.Loop() {
		if checkHead(raw) != headOK {
			b.Fatal("fault")
		}
	}
}
