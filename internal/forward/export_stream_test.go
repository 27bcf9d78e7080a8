package forward_test

import (
	"context"
	"encoding/base64"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/adminapi"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

// TestExportSlowCallerOutlivesWriteTimeout: on the real admin listener with a
// 1 s write time-out, a caller reading an archive slowly for longer than
// that gets all of it; a caller that stops reading for longer than
// the forwarder's IdleTimeout is cut.
func TestExportSlowCallerOutlivesWriteTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("reads slowly for 2 s, then stops for the 1 s IdleTimeout")
	}
	_, up := forwardtest.StartSim(t, sim.Config{})
	ctl := &simtest.Control{Base: up}
	syn := int64(24 << 20)
	if err := ctl.SetExport(context.Background(), simtest.ExportConfig{SyntheticBytesPerHour: &syn}); err != nil {
		t.Fatal(err)
	}
	// serve starts the admin listener (its write time-out 1 s) with the
	// export route of a forwarder whose IdleTimeout is idle; it returns
	// the listener's address.
	serve := func(idle time.Duration) string {
		admin, err := adminapi.New(adminapi.Config{WriteTimeout: time.Second}, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		admin.Register(forwardtest.Build(t, forward.Config{IdleTimeout: idle}, forwardtest.WebCreds(t), forward.Export(forward.APIConfig{URL: baseurl.NewRef(up)}))...)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go admin.Serve(ln)
		t.Cleanup(func() { admin.Shutdown(context.Background()) })
		return ln.Addr().String()
	}
	// get starts an export; a 502 (the sim's first byte later than a short
	// IdleTimeout, on a loaded machine) is tried again. tries counts the
	// export requests sent, each of which the sim logs once it ends.
	tries := 0
	get := func(addr string) *http.Response {
		var resp *http.Response
		polltest.Until(t, "an export answered 200", func() bool {
			tries++
			req, _ := http.NewRequest("GET", "http://"+addr+forward.ExportPath+"?start=20260101T00&end=20260101T00", nil)
			req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("proj:proj-secret")))
			r, err := http.DefaultClient.Do(req)
			if err == nil && r.StatusCode == http.StatusBadGateway {
				r.Body.Close()
				return false
			}
			if err != nil || r.StatusCode != 200 {
				t.Fatalf("export: %v %v", r, err)
			}
			resp = r
			return true
		})
		return resp
	}
	// The slow reader pauses far less than the forwarder's IdleTimeout
	// (polltest.Max) however loaded the machine: only the write time-out
	// could cut it.
	resp := get(serve(polltest.Max))
	t0 := time.Now()
	var n int64
	buf := make([]byte, 512<<10)
	for {
		m, err := io.ReadFull(resp.Body, buf)
		n += int64(m)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			t.Fatalf("slow reader cut after %d bytes and %v: %v", n, time.Since(t0), err)
		}
		time.Sleep(40 * time.Millisecond)
	}
	resp.Body.Close()
	log, _ := ctl.ExportLog(context.Background())
	if took := time.Since(t0); took < 1500*time.Millisecond || len(log) != 1 || n != log[0].Bytes {
		t.Fatalf("read %d bytes in %v (sim sent %+v): the test did not outlast the write time-out", n, took, log)
	}

	// A 1 s IdleTimeout: the reader stops until the forwarder cut it.
	// The sim's handler, blocked writing to the forwarder once the socket
	// buffers are full, ends (and logs the request) only when the
	// forwarder gave the upstream request up, its write to the caller
	// having timed out: a failed write logs 0 bytes. A forwarder that never
	// cuts keeps it blocked, and the wait fails.
	resp = get(serve(time.Second))
	stalled := resp.Body
	t.Cleanup(func() { stalled.Close() }) // before the listener's Shutdown, which waits for the handler
	io.ReadFull(resp.Body, buf)
	polltest.Until(t, "the sim's handler of the stalled export to end", func() bool {
		var err error
		log, err = ctl.ExportLog(context.Background())
		return err == nil && len(log) == tries
	})
	for _, l := range log[1:] {
		if l.Bytes != 0 {
			// The sim wrote it all into the socket buffers: its end tells
			// nothing. Wait long enough that the forwarder's timer, however
			// late a loaded machine runs it, fired before the reader reads
			// again.
			t.Logf("the sim sent the whole archive (%+v): waiting 10 s instead", log)
			time.Sleep(10 * time.Second)
			break
		}
	}
	_, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil {
		t.Fatal("a caller that stopped reading was never cut")
	}
}
