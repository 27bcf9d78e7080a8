package forward_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/adminapi"
	"github.com/svcrelay/relay/internal/baseurl"
	"github.com/svcrelay/relay/internal/forward"
	"github.com/svcrelay/relay/internal/forward/forwardtest"
	"github.com/svcrelay/relay/internal/sim"
	"github.com/svcrelay/relay/internal/simtest"
)

const exportHelperEnv = "RELAY_EXPORT_HELPER_UPSTREAM"

// TestHelperRelayProcess is the relay side of TestExportStreamsInFlatMemory,
// run in a subprocess so that its peak RSS (VmHWM) is the relay's alone. It
// serves the export route on the real admin listener (internal/adminapi) on
// 127.0.0.1, prints its address, and answers GET /test/vmhwm with its VmHWM
// in KiB.
func TestHelperRelayProcess(t *testing.T) {
	up := os.Getenv(exportHelperEnv)
	if up == "" {
		t.Skip("helper process of TestExportStreamsInFlatMemory")
	}
	admin, err := adminapi.New(adminapi.Config{}, nil, nil) // the real admin listener, its default time-outs
	if err != nil {
		t.Fatal(err)
	}
	admin.Register(forwardtest.Build(t, forward.Config{}, forwardtest.WebCreds(t), forward.Export(forward.APIConfig{URL: baseurl.NewRef(up)}))...)
	admin.Handle(http.MethodGet, "/test/vmhwm", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		kb, err := exportVmHWM()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		io.WriteString(w, strconv.FormatInt(kb, 10))
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("LISTEN %s\n", ln.Addr())
	go func() { io.Copy(io.Discard, os.Stdin); ln.Close() }() // the parent closes stdin to stop us
	admin.Serve(ln)
}

// exportVmHWM returns this process's peak resident set size in KiB.
func exportVmHWM() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

// TestExportStreamsInFlatMemory moves a 2.1 GB synthetic export archive
// from the simulator through the relay's export route (in a subprocess) and
// requires the relay's peak RSS to stay under 100 MB.
func TestExportStreamsInFlatMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 2.1 GB")
	}
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("needs /proc/self/status")
	}
	const hours, perHour = 20, 100 << 20 // 2.0 GiB (2.1 GB) of archive
	_, up := forwardtest.StartSim(t, sim.Config{})
	ctl := &simtest.Control{Base: up}
	syn := int64(perHour)
	if err := ctl.SetExport(context.Background(), simtest.ExportConfig{MaxBytes: 1 << 40, SyntheticBytesPerHour: &syn}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRelayProcess$")
	cmd.Env = append(os.Environ(), exportHelperEnv+"="+up)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "LISTEN ")
	if err != nil || !ok {
		t.Fatalf("helper said %q: %v", line, err)
	}
	go io.Copy(io.Discard, stdout)
	relay := "http://" + addr
	before := exportHwm(t, relay)

	req, _ := http.NewRequest("GET", relay+forward.ExportPath+"?start=20260101T00&end=20260101T19", nil)
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("proj:proj-secret")))
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, 4)
	io.ReadFull(resp.Body, head)
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	n += 4
	took := time.Since(t0)
	if err != nil || resp.StatusCode != 200 || string(head) != "PK\x03\x04" {
		t.Fatalf("status %d, %d bytes, head %q: %v", resp.StatusCode, n, head, err)
	}
	log, err := ctl.ExportLog(context.Background())
	if err != nil || len(log) != 1 || log[0].Bytes != n || n < hours*perHour {
		t.Fatalf("relay passed %d bytes, sim log %+v (%v)", n, log, err)
	}
	peak := exportHwm(t, relay)
	t.Logf("moved %.2f GB in %v (%.0f MB/s); relay VmHWM %d KiB before, %d KiB after (%.1f MB)",
		float64(n)/1e9, took.Round(time.Millisecond), float64(n)/1e6/took.Seconds(), before, peak, float64(peak)*1024/1e6)
	if peak*1024 >= 100e6 {
		t.Fatalf("relay peak RSS %.1f MB, want under 100 MB", float64(peak)*1024/1e6)
	}
}

func exportHwm(t *testing.T, relay string) int64 {
	t.Helper()
	resp, err := http.Get(relay + "/test/vmhwm")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	kb, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		t.Fatalf("vmhwm %q: %v", b, err)
	}
	return kb
}
