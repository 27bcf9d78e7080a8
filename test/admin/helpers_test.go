// Package admin holds binary-level tests of the relay's admin listener: the
// real relay binary against the simulated upstream (internal/sim, served in
// the test process on 127.0.0.1), driven over real HTTP.
package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
)

// Secrets of the credentials file and the admin token. Each is distinct and
// unlikely to occur by chance, so a search of logs and answers finds them.
const (
	adminToken   = "adm-TOKEN-7f3e9c1b2a"
	projAPIKey   = "proj-APIKEY-5d8c2e7a41"
	projSecret   = "proj-SECRET-9b1f6a3c72"
	proj2APIKey  = "proj2-APIKEY-3a7e1c9d05"
	proj2Secret  = "proj2-SECRET-c4e8a2f6b1"
	orgAPIKey    = "org-APIKEY-e2b7d4a9c3"
	orgSecret    = "org-SECRET-1c5f8e3b7d"
	mgmtKey      = "org-MGMT-8d2a6c4e9f"
	scimToken    = "org-SCIM-4f9b3e7a1c"
	wrongToken   = "adm-TOKEN-7f3e9c1b2b" // one byte off
	projectName  = "web-prod"
	project2Name = "web-eu"
)

var secrets = []string{adminToken, projAPIKey, projSecret, proj2APIKey, proj2Secret, orgAPIKey, orgSecret, mgmtKey, scimToken}

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// relayBin builds the relay binary once per test process.
func relayBin(t *testing.T) string {
	t.Helper()
	trackSources(t)
	binOnce.Do(func() {
		goBin, err := exec.LookPath("go")
		if err != nil {
			goBin = "/usr/local/go/bin/go"
		}
		binDir, binErr = os.MkdirTemp("", "relay-admin-test")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "relay")
		out, err := exec.Command(goBin, "build", "-o", binPath, "github.com/svcrelay/relay/cmd/relay").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// trackSources stats the relay's sources so that an edit invalidates a
// cached pass (the binary is built in a subprocess the go command does not
// see).
func trackSources(t *testing.T) {
	t.Helper()
	root := filepath.Join("..", "..")
	for _, dir := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
				_, err = os.Stat(p)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// writeFiles writes the credentials file and the admin token file (0600)
// into dir and returns their paths.
func writeFiles(t *testing.T, dir string, analyticsURL string) (creds, token string) {
	t.Helper()
	creds = filepath.Join(dir, "credentials.yaml")
	yaml := fmt.Sprintf(`projects:
  - name: %s
    api_key: %q
    secret_key: %q
  - name: %s
    api_key: %q
    secret_key: %q
    analytics_url: %q
organizations:
  - name: acme
    api_key: %q
    secret_key: %q
    management_api_key: %q
    scim_token: %q
    projects: [%s, %s]
`, projectName, projAPIKey, projSecret, project2Name, proj2APIKey, proj2Secret, analyticsURL,
		orgAPIKey, orgSecret, mgmtKey, scimToken, projectName, project2Name)
	if err := os.WriteFile(creds, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	token = filepath.Join(dir, "admin.token")
	if err := os.WriteFile(token, []byte(adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return creds, token
}

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// relay is one running relay binary.
type relay struct {
	t       *testing.T
	cmd     *exec.Cmd
	done    chan error
	log     *syncBuf
	ingest  string // http://addr
	admin   string // http://addr
	dataDir string
}

// startRelay starts the binary with args plus listen addresses, data dir and
// quiet defaults, and waits for /readyz.
func startRelay(t *testing.T, dataDir string, log *syncBuf, args ...string) *relay {
	t.Helper()
	ingest, admin := harness.FreeAddr(t), harness.FreeAddr(t)
	all := append([]string{
		"--listen", ingest, "--admin-listen", admin, "--data-dir", dataDir,
		"--spool-min-free-bytes", "0", "--log-format", "json", "--log-level", "debug",
		"--drain-timeout", "2s", "--flush-interval", "20ms",
	}, args...)
	cmd := exec.Command(relayBin(t), all...)
	cmd.Env = harness.CleanEnv()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &relay{t: t, cmd: cmd, done: make(chan error, 1), log: log,
		ingest: "http://" + ingest, admin: "http://" + admin, dataDir: dataDir}
	go func() { r.done <- cmd.Wait() }()
	t.Cleanup(func() { r.stop() })
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(polltest.Max)
	for time.Now().Before(deadline) {
		select {
		case err := <-r.done:
			r.done <- err
			t.Fatalf("relay exited during start: %v\n%s", err, log.String())
		default:
		}
		resp, err := hc.Get(r.admin + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return r
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Kill()
	t.Fatalf("relay not ready within %v\n%s", polltest.Max, log.String())
	return nil
}

// stop ends the relay with SIGTERM (SIGKILL after polltest.Max: the relay's
// own --drain-timeout bounds a stop, and a loaded machine must not turn a
// slow clean stop into a kill); harmless twice.
func (r *relay) stop() {
	if r.cmd.ProcessState != nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		r.done <- err
	case <-time.After(polltest.Max):
		_ = r.cmd.Process.Kill()
		r.done <- <-r.done
	}
}

// stopClean stops the relay with SIGTERM and wants exit status 0.
func (r *relay) stopClean() {
	r.t.Helper()
	r.stop()
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		r.t.Errorf("relay exited %d after SIGTERM\n%s", code, r.log.String())
	}
}

// kill ends the relay with SIGKILL and waits for it.
func (r *relay) kill() {
	r.t.Helper()
	if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	select {
	case err := <-r.done:
		r.done <- err
	case <-time.After(polltest.Max):
		r.t.Fatal("killed relay did not exit")
	}
}

// answer is one HTTP answer; every answer is kept for the leak check.
type answer struct {
	status int
	header http.Header
	body   []byte
}

type recorder struct {
	mu      sync.Mutex
	answers []answer
}

var answers recorder

func (rc *recorder) add(a answer) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.answers = append(rc.answers, a)
}

func (rc *recorder) all() []answer {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]answer(nil), rc.answers...)
}

// call sends one request; hdr is name, value pairs.
func call(t *testing.T, method, u string, body string, hdr ...string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
	}
	if body != "" && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header, body: b}
	answers.add(a)
	return a
}

func bearer(tok string) string { return "Bearer " + tok }

// own calls a relay route with the admin token in Authorization.
func (r *relay) own(method, path, body string, hdr ...string) answer {
	r.t.Helper()
	return call(r.t, method, r.admin+path, body, append([]string{"Authorization", bearer(adminToken)}, hdr...)...)
}

// decode unmarshals an answer's JSON body into v.
func decode(t *testing.T, a answer, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("answer %d %q: %v", a.status, a.body, err)
	}
}

// postEvents sends events to the relay's ingest listener and wants 200.
func (r *relay) postEvents(apiKey string, events ...string) {
	r.t.Helper()
	body := fmt.Sprintf(`{"api_key":%q,"events":[%s]}`, apiKey, strings.Join(events, ","))
	a := call(r.t, "POST", r.ingest+"/2/httpapi", body)
	if a.status != 200 {
		r.t.Fatalf("ingest: %d %s", a.status, a.body)
	}
}

func event(device, insertID string) string {
	return fmt.Sprintf(`{"event_type":"admin_test","device_id":%q,"insert_id":%q}`, device, insertID)
}

// form encodes name, value pairs.
func form(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Set(kv[i], kv[i+1])
	}
	return v.Encode()
}

const formType = "application/x-www-form-urlencoded"

// headerRecorder is an HTTP reverse proxy in front of the sim that records
// the auth headers of every request it forwards.
type headerRecorder struct {
	mu   sync.Mutex
	seen []http.Header
}

func startHeaderRecorder(t *testing.T, target string) (*headerRecorder, string) {
	t.Helper()
	hr := &headerRecorder{}
	tu, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hr.mu.Lock()
		hr.seen = append(hr.seen, r.Header.Clone())
		hr.mu.Unlock()
		out, err := http.NewRequestWithContext(r.Context(), r.Method, tu.String()+r.URL.RequestURI(), r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		out.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return hr, "http://" + ln.Addr().String()
}

func (hr *headerRecorder) last() http.Header {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	if len(hr.seen) == 0 {
		return nil
	}
	return hr.seen[len(hr.seen)-1]
}

func (hr *headerRecorder) count() int {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return len(hr.seen)
}
