// Package deploy holds no Go code: its tests check the deployment files
// against the real relay binary. The alert rules' own unit tests run with
// promtool (.ci/run); the container image is built and smoke-tested by
// deploy/image.sh.
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/svcrelay/relay/internal/polltest"
	"github.com/svcrelay/relay/test/e2e/harness"
	"go.yaml.in/yaml/v3"
)

// pending lists metrics that the dashboard and the alert rules name before
// the relay exports them: each is being added by another issue in flight.
// Remove an entry once its metric lands (the test then checks it).
var pending = map[string]string{}

// external are series Prometheus itself makes, not the relay.
var external = map[string]bool{"up": true}

// relayFixture is a real relay binary serving against a real `relay sim`,
// with some traffic of every kind, scraped.
type relayFixture struct {
	bin     string
	relay   *harness.Relay
	metrics map[string]bool // sample names of one scrape
}

func startRelay(t *testing.T) *relayFixture {
	t.Helper()
	if testing.Short() {
		t.Skip("builds and runs the relay binary")
	}
	bin := harness.Build(t)
	dir := t.TempDir()
	sm := harness.StartSim(t, bin, dir)
	// A project observing its tracking plan (the simulator's empty
	// taxonomy: every event type is unplanned), so the plan's series exist.
	creds, token := filepath.Join(dir, "creds.yaml"), filepath.Join(dir, "token")
	if err := os.WriteFile(creds, []byte("projects:\n  - name: deploy\n    api_key: deploy-key\n    secret_key: deploy-secret\n    tracking_plan: observe\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(token, []byte("deploy-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := harness.StartRelay(t, bin, dir, &harness.RelayOpts{
		DataDir: filepath.Join(dir, "data"), IngestURL: sm.Base,
		Extra: []string{"--alias-url", sm.Base, "--analytics-url", sm.Base, "--credentials", creds, "--admin-token-file", token},
	})
	hc := harness.NewClient()
	polltest.Until(t, "the tracking plan read", func() bool {
		resp, err := hc.Get("http://" + r.AdminListen + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && !strings.Contains(string(b), "tracking plan")
	})
	if code, body, err := r.Post(hc, "/2/httpapi", []byte(`{"api_key":"deploy-key","events":[{"event_type":"e","device_id":"device-deploy"}]}`)); err != nil || code != 200 {
		t.Fatalf("ingest: %d %s %v", code, body, err)
	}
	if code, _, err := r.Post(hc, "/2/httpapi", []byte(`{"api_key":"deploy-key","events":[{"device_id":"device-deploy"}]}`)); err != nil || code != 400 {
		t.Fatalf("invalid ingest: %d %v", code, err)
	}
	form := "api_key=deploy-key&identification=" + `[{"group_type":"org","group_value":"acme","group_properties":{"$set":{"plan":"gold"}}}]`
	req, _ := http.NewRequest("POST", "http://"+r.AdminListen+"/groupidentify", strings.NewReader(strings.ReplaceAll(form, "$", "%24")))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer deploy-token")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("groupidentify: %d", resp.StatusCode)
	}
	polltest.Until(t, "the event delivered", func() bool {
		n, _ := r.Metric("relay_delivery_events_delivered_total")
		v, _ := r.Metric("relay_plan_violations_total")
		return n >= 1 && v >= 1
	})
	f := &relayFixture{bin: bin, relay: r, metrics: map[string]bool{}}
	resp, err = http.Get("http://" + r.AdminListen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		f.metrics[name] = true
	}
	if !f.metrics["relay_build_info"] || !f.metrics["relay_upstream_requests_total"] {
		t.Fatalf("scrape lacks relay_build_info or relay_upstream_requests_total: %d names", len(f.metrics))
	}
	return f
}

var (
	promString = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promBraces = regexp.MustCompile(`\{[^{}]*\}|\[[^\]]*\]`)
	promGroup  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promIdent  = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promWords  = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "by": true,
		"without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true, "inf": true, "nan": true}
)

// metricNames returns the metric names a PromQL expression selects: its
// identifiers less strings, label matchers, ranges, grouping clauses,
// functions and keywords.
func metricNames(expr string) []string {
	e := promString.ReplaceAllString(expr, `""`)
	for {
		n := promBraces.ReplaceAllString(e, " ")
		n = promGroup.ReplaceAllString(n, " ")
		if n == e {
			break
		}
		e = n
	}
	var names []string
	for _, loc := range promIdent.FindAllStringIndex(e, -1) {
		w := e[loc[0]:loc[1]]
		rest := strings.TrimLeft(e[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promWords[strings.ToLower(w)] {
			continue // a function or keyword
		}
		if loc[0] > 0 && (e[loc[0]-1] >= '0' && e[loc[0]-1] <= '9' || e[loc[0]-1] == '.') {
			continue // a number's exponent or unit (1e9)
		}
		names = append(names, w)
	}
	return names
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (le, kind) (rate(relay_upstream_request_seconds_bucket{job="relay", instance=~"$instance"}[$__rate_interval]))) / on (instance) group_left relay_x and 1e9 > bool 2`)
	if want := []string{"relay_upstream_request_seconds_bucket", "relay_x"}; !slices.Equal(got, want) {
		t.Fatalf("metricNames = %q, want %q", got, want)
	}
}

// queries returns every PromQL expression of the dashboard and of the alert
// rules, by where it is.
func queries(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	b, err := os.ReadFile("grafana/relay.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("grafana/relay.json: %v", err)
	}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			out[fmt.Sprintf("dashboard panel %q query %d", p.Title, i)] = tg.Expr
		}
	}
	for _, v := range dash.Templating.List {
		if d, ok := strings.CutPrefix(v.Definition, "label_values("); ok {
			out["dashboard variable "+v.Name] = strings.TrimSuffix(d[:strings.LastIndexByte(d, ',')], ")")
		}
	}
	for _, r := range readRules(t) {
		out["alert "+r.Alert] = r.Expr
	}
	return out
}

type rule struct {
	Alert, Expr string
}

func readRules(t *testing.T) []rule {
	t.Helper()
	b, err := os.ReadFile("prometheus/relay-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	var rs []rule
	for _, g := range f.Groups {
		rs = append(rs, g.Rules...)
	}
	return rs
}

// TestQueriesNameExportedMetrics: every metric the dashboard and the alert
// rules query is one the real relay exports (scraped after traffic of every
// kind), or a pending one listed above.
func TestQueriesNameExportedMetrics(t *testing.T) {
	f := startRelay(t)
	qs := queries(t)
	if len(qs) < 30 {
		t.Fatalf("only %d queries found: is the dashboard's shape what the test reads?", len(qs))
	}
	used := map[string]bool{}
	for where, q := range qs {
		names := metricNames(q)
		if len(names) == 0 {
			t.Errorf("%s: no metric in %q", where, q)
		}
		for _, n := range names {
			used[n] = true
			if f.metrics[n] || external[n] {
				continue
			}
			if _, ok := pending[n]; ok {
				continue
			}
			t.Errorf("%s: %s is not exported by the relay (query %q)", where, n, q)
		}
	}
	for n := range pending {
		if f.metrics[n] {
			t.Errorf("%s is exported now: remove it from pending", n)
		}
		if !used[n] {
			t.Errorf("%s is pending but no query uses it", n)
		}
	}
}

// TestEveryAlertTested: every alert of relay-rules.yml has a promtool unit
// test that expects it to fire.
func TestEveryAlertTested(t *testing.T) {
	b, err := os.ReadFile("prometheus/relay-rules.test.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Tests []struct {
			AlertRuleTest []struct {
				Alertname string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	rules := readRules(t)
	if len(rules) < 10 {
		t.Fatalf("%d rules", len(rules))
	}
	for _, r := range rules {
		if !fires[r.Alert] {
			t.Errorf("alert %s: no unit test expects it to fire", r.Alert)
		}
		if !quiet[r.Alert] && r.Alert != "RelayRestarting" {
			t.Errorf("alert %s: no unit test expects it to stay quiet", r.Alert)
		}
	}
}

// containerfileFinal returns the instructions of a Containerfile's last
// stage, with COPY sources dropped (the stages copy from different places).
func containerfileFinal(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	var final []string
	for line := range strings.SplitSeq(text, "\n") {
		line = strings.Join(strings.Fields(line), " ")
		if line == "" || line[0] == '#' {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			final = nil
		}
		if f := strings.Fields(line); f[0] == "COPY" {
			var keep []string
			for _, w := range f[1 : len(f)-1] {
				if strings.HasPrefix(w, "--chown") {
					keep = append(keep, w)
				}
			}
			line = "COPY " + strings.Join(append(keep, f[len(f)-1]), " ")
		}
		final = append(final, line)
	}
	return final
}

// TestContainerfiles: both Containerfiles end in the same image, whose
// settings the relay accepts (relay config check with the image's ENV).
func TestContainerfiles(t *testing.T) {
	a, b := containerfileFinal(t, "Containerfile"), containerfileFinal(t, "Containerfile.multistage")
	if !slices.Equal(a, b) {
		t.Fatalf("final stages differ:\nContainerfile:\n%s\nContainerfile.multistage:\n%s", strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	want := []string{"FROM scratch", "USER 65532:65532", `VOLUME ["/data"]`, "EXPOSE 8080 8081", `ENTRYPOINT ["/relay"]`}
	for _, w := range want {
		if !slices.Contains(a, w) {
			t.Errorf("Containerfile lacks %q", w)
		}
	}
	var env []string
	for _, l := range a {
		if rest, ok := strings.CutPrefix(l, "ENV "); ok {
			env = append(env, strings.Fields(rest)...)
		}
	}
	if !slices.Contains(env, "RELAY_LISTEN=0.0.0.0:8080") || !slices.Contains(env, "RELAY_ADMIN_LISTEN=0.0.0.0:8081") {
		t.Errorf("the image's listeners are not on 0.0.0.0: %q", env)
	}
	const tokenFile = "RELAY_ADMIN_TOKEN_FILE=/run/secrets/relay-admin-token"
	if !slices.Contains(env, tokenFile) {
		t.Fatalf("the image reads no admin token file (want %s): %q", tokenFile, env)
	}
	if testing.Short() {
		return
	}
	bin := harness.Build(t)
	// The image's settings with its secret file mounted (here: a file
	// elsewhere) are accepted; without the file, or without the setting,
	// the relay refuses its admin listener on 0.0.0.0.
	token := filepath.Join(t.TempDir(), "relay-admin-token")
	if err := os.WriteFile(token, []byte("image-test-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mounted := slices.Clone(env)
	mounted[slices.Index(mounted, tokenFile)] = "RELAY_ADMIN_TOKEN_FILE=" + token
	configCheck(t, bin, mounted)
	refused := func(env []string, want string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "config", "check")
		cmd.Env = append(harness.CleanEnv(), env...)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
			t.Errorf("relay config check with %q: %v, want exit 2 and %q:\n%s", env, err, want, out)
		}
	}
	refused(env, "/run/secrets/relay-admin-token")
	refused(slices.DeleteFunc(slices.Clone(env), func(s string) bool { return s == tokenFile }),
		`admin-listen "0.0.0.0:8081" is not a loopback address and no admin-token (or admin-token-file) is set`)
	// And the example settings file of the systemd unit.
	configCheck(t, bin, nil, "--config", "relay.yaml")
}

// configCheck runs `relay config check args...` with env and wants exit 0.
func configCheck(t *testing.T, bin string, env []string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), polltest.Max)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"config", "check"}, args...)...)
	cmd.Env = append(harness.CleanEnv(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("relay config check with %q: %v\n%s", env, err, out)
	}
}

// k8sDoc is one object of a manifest file.
type k8sDoc map[string]any

func (d k8sDoc) str(path ...string) string {
	v, _ := dig(map[string]any(d), path...).(string)
	return v
}

func dig(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func list(v any) []map[string]any {
	var out []map[string]any
	if l, ok := v.([]any); ok {
		for _, it := range l {
			if m, ok := it.(map[string]any); ok {
				out = append(out, m)
			}
		}
	}
	return out
}

func readManifest(t *testing.T, path string) []k8sDoc {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var docs []k8sDoc
	for {
		var m map[string]any // nested mappings decode as map[string]any
		err := dec.Decode(&m)
		d := k8sDoc(m)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if d == nil {
			continue
		}
		for _, f := range []string{"apiVersion", "kind"} {
			if d.str(f) == "" {
				t.Errorf("%s: an object without %s", path, f)
			}
		}
		if d.str("metadata", "name") == "" {
			t.Errorf("%s: a %s without metadata.name", path, d.str("kind"))
		}
		docs = append(docs, d)
	}
	return docs
}

// openRoutes are the admin routes the kubelet and Prometheus may call
// without the admin token; the test asks the running relay for each.
var openRoutes = []string{"/healthz", "/readyz", "/metrics"}

// TestKubernetesManifests checks the structure kubectl would (without an
// API server, which `kubectl apply --dry-run=client` needs for its
// schemas) and what only the relay knows: probe paths are its open routes,
// probe and Service ports exist, the relay container's settings pass
// `relay config check`, the grace period covers preStop plus the drain.
func TestKubernetesManifests(t *testing.T) {
	f := startRelay(t)
	for _, p := range openRoutes {
		resp, err := http.Get("http://" + f.relay.AdminListen + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("the relay answers %s with %d without a token, want 200", p, resp.StatusCode)
		}
	}
	files, _ := filepath.Glob("kubernetes/*.yaml")
	if len(files) < 3 {
		t.Fatalf("kubernetes/: %q", files)
	}
	relays := 0
	for _, file := range files {
		docs := readManifest(t, file)
		secrets := map[string]bool{}
		for _, d := range docs {
			if d.str("kind") == "Secret" {
				secrets[d.str("metadata", "name")] = true
			}
		}
		var podLabels []map[string]any
		var podPorts []map[string]bool
		for _, d := range docs {
			kind, name := d.str("kind"), d.str("metadata", "name")
			where := fmt.Sprintf("%s %s %s", file, kind, name)
			switch kind {
			case "Deployment", "StatefulSet":
				tmpl := dig(map[string]any(d), "spec", "template")
				labels, _ := dig(tmpl, "metadata", "labels").(map[string]any)
				sel, _ := dig(map[string]any(d), "spec", "selector", "matchLabels").(map[string]any)
				if len(sel) == 0 {
					t.Errorf("%s: no spec.selector.matchLabels", where)
				}
				for k, v := range sel {
					if labels[k] != v {
						t.Errorf("%s: selector %s=%v does not match the pod template's labels", where, k, v)
					}
				}
				podLabels = append(podLabels, labels)
				ports := map[string]bool{}
				pod, _ := dig(tmpl, "spec").(map[string]any)
				vols := map[string]bool{}
				for _, v := range list(pod["volumes"]) {
					vols[v["name"].(string)] = true
					if s := dig(v, "secret", "secretName"); s != nil && !secrets[s.(string)] {
						t.Errorf("%s: volume %v names Secret %v, not in the file", where, v["name"], s)
					}
				}
				for _, v := range list(dig(map[string]any(d), "spec", "volumeClaimTemplates")) {
					vols[dig(v, "metadata", "name").(string)] = true
				}
				containers := append(list(pod["initContainers"]), list(pod["containers"])...)
				for _, c := range containers {
					cname, _ := c["name"].(string)
					if cname == "" || c["image"] == nil {
						t.Errorf("%s: a container without name or image", where)
					}
					cports := map[string]int{}
					for _, p := range list(c["ports"]) {
						n, _ := p["name"].(string)
						cports[n], _ = p["containerPort"].(int)
						ports[n], ports[fmt.Sprint(p["containerPort"])] = true, true
					}
					for _, m := range list(c["volumeMounts"]) {
						if !vols[m["name"].(string)] {
							t.Errorf("%s container %s: mount of unknown volume %v", where, cname, m["name"])
						}
					}
					if cname != "relay" {
						continue
					}
					relays++
					checkRelayContainer(t, f.bin, where, pod, c, cports)
				}
				podPorts = append(podPorts, ports)
				ann, _ := dig(tmpl, "metadata", "annotations").(map[string]any)
				if p, ok := ann["prometheus.io/port"]; ok && !ports[fmt.Sprint(p)] {
					t.Errorf("%s: prometheus.io/port %v is no container port", where, p)
				}
				if p, ok := ann["prometheus.io/path"]; ok && !slices.Contains(openRoutes, fmt.Sprint(p)) {
					t.Errorf("%s: prometheus.io/path %v is not an open route", where, p)
				}
			}
		}
		for _, d := range docs {
			kind, where := d.str("kind"), fmt.Sprintf("%s %s %s", file, d.str("kind"), d.str("metadata", "name"))
			var sel map[string]any
			switch kind {
			case "Service":
				sel, _ = dig(map[string]any(d), "spec", "selector").(map[string]any)
			case "PodDisruptionBudget":
				sel, _ = dig(map[string]any(d), "spec", "selector", "matchLabels").(map[string]any)
			default:
				continue
			}
			matched := -1
			for i, l := range podLabels {
				ok := len(sel) > 0
				for k, v := range sel {
					ok = ok && l[k] == v
				}
				if ok {
					matched = i
				}
			}
			if matched < 0 {
				t.Errorf("%s: selector %v matches no pod of the file", where, sel)
				continue
			}
			for _, p := range list(dig(map[string]any(d), "spec", "ports")) {
				if tp := fmt.Sprint(p["targetPort"]); p["targetPort"] != nil && !podPorts[matched][tp] {
					t.Errorf("%s: targetPort %s is no port of the pods", where, tp)
				}
			}
		}
	}
	if relays < 3 {
		t.Fatalf("%d relay containers found, want the sidecar's, the central one and the fleet's", relays)
	}
}

// checkRelayContainer checks one relay container of a pod.
func checkRelayContainer(t *testing.T, bin, where string, pod, c map[string]any, ports map[string]int) {
	t.Helper()
	env := map[string]string{}
	var envList []string
	dir := t.TempDir()
	for _, e := range list(c["env"]) {
		n, v := e["name"].(string), fmt.Sprint(e["value"])
		env[n] = v
		switch n {
		case "RELAY_ADMIN_TOKEN_FILE": // the Secret's file
			v = filepath.Join(dir, "token")
			if err := os.WriteFile(v, []byte("a-token-for-the-check"), 0o600); err != nil {
				t.Fatal(err)
			}
		case "RELAY_DATA_DIR":
			v = filepath.Join(dir, "data")
		}
		envList = append(envList, n+"="+v)
	}
	configCheck(t, bin, envList)
	adminPort := ports["admin"]
	if !strings.HasSuffix(env["RELAY_ADMIN_LISTEN"], fmt.Sprintf(":%d", adminPort)) || !strings.HasPrefix(env["RELAY_ADMIN_LISTEN"], "0.0.0.0:") {
		t.Errorf("%s: RELAY_ADMIN_LISTEN %q: the kubelet and Prometheus reach the pod's IP on the admin port %d", where, env["RELAY_ADMIN_LISTEN"], adminPort)
	}
	if env["RELAY_ADMIN_TOKEN_FILE"] == "" {
		t.Errorf("%s: no admin token: the admin port is reachable in the cluster", where)
	}
	for _, probe := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
		get, _ := dig(c, probe, "httpGet").(map[string]any)
		if get == nil {
			t.Errorf("%s: no %s.httpGet", where, probe)
			continue
		}
		if get["port"] != "admin" {
			t.Errorf("%s: %s on port %v, want the admin port", where, probe, get["port"])
		}
		want := "/healthz"
		if probe == "readinessProbe" {
			want = "/readyz"
		}
		if get["path"] != want {
			t.Errorf("%s: %s path %v, want %s", where, probe, get["path"], want)
		}
	}
	if dig(c, "resources", "limits", "memory") == nil || dig(c, "resources", "requests", "memory") == nil {
		t.Errorf("%s: memory request and limit wanted", where)
	}
	user := dig(c, "securityContext", "runAsUser")
	if user == nil {
		user = dig(pod, "securityContext", "runAsUser")
	}
	if u, ok := user.(int); !ok || u == 0 {
		if dig(c, "securityContext", "runAsNonRoot") != true && dig(pod, "securityContext", "runAsNonRoot") != true {
			t.Errorf("%s: the relay may run as root", where)
		}
	}
	drain := 10 * time.Second
	if d, ok := env["RELAY_DRAIN_TIMEOUT"]; ok {
		var err error
		if drain, err = time.ParseDuration(d); err != nil {
			t.Errorf("%s: RELAY_DRAIN_TIMEOUT %q", where, d)
		}
	}
	pre := 0
	if s, ok := dig(c, "lifecycle", "preStop", "sleep", "seconds").(int); ok {
		pre = s
	}
	grace, ok := pod["terminationGracePeriodSeconds"].(int)
	if need := pre + int((2*drain+5*time.Second)/time.Second); !ok || grace <= need {
		t.Errorf("%s: terminationGracePeriodSeconds %v, want more than preStop %ds + 2 x drain %s + 5s = %ds", where, pod["terminationGracePeriodSeconds"], pre, drain, need)
	}
}
