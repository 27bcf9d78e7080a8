package credentials

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"go.yaml.in/yaml/v3"
)

// fixtureSecrets returns every secret-looking value of a fixture: all test
// secrets start with "proj-" or "org-" and end in a digit group, plus the
// misplaced "sk-short".
func fixtureSecrets(t *testing.T, data []byte) []string {
	t.Helper()
	re := regexp.MustCompile(`(?:proj|org)-[a-z-]+-[0-9]{4}`)
	out := re.FindAllString(string(data), -1)
	return append(out, "sk-short", "proj-url-password")
}

func TestLoadFixtures(t *testing.T) {
	tests := []struct {
		file string
		want []string // substrings of the error; nil: no error
	}{
		{"valid.yaml", nil},
		{"unknown_key.yaml", []string{"line 5", `unknown key "analytic_url" in a project`}},
		{"unknown_org_key.yaml", []string{"line 9", `unknown key "scim_tokn" in an organization`}},
		{"unknown_top_key.yaml", []string{"line 1", `unknown key "project"`}},
		{"duplicate_project.yaml", []string{"line 5", `project "web-prod": name used twice`}},
		{"duplicate_org.yaml", []string{"line 9", `organization "acme": name used twice`}},
		{"duplicate_api_key.yaml", []string{"line 5", `project "ios-prod": api_key is the same as project "web-prod"'s`}},
		{"unknown_project_in_org.yaml", []string{"line 6", `organization "acme": project "web-prd" is not in projects`}},
		{"project_in_two_orgs.yaml", []string{"line 10", `organization "globex": project "web-prod" is already in organization "acme"`}},
		{"missing_secret_key.yaml", []string{"line 2", `project "web-prod": secret_key is empty or missing`}},
		{"missing_name.yaml", []string{"line 2", "projects[0]: name is empty or missing"}},
		{"missing_org_secret.yaml", []string{"line 2", `organization "acme": secret_key is empty or missing`}},
		{"bad_url.yaml", []string{"line 2", `project "web-prod": alias_url: want an http:// or https:// base URL`}},
		{"secret_in_wrong_place.yaml", []string{"line 10", "line 11", "(value hidden)"}},
		{"empty.yaml", []string{"empty file"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join("testdata", tt.file)
			s, err := Load(path)
			if tt.want == nil {
				if err != nil || s == nil {
					t.Fatalf("Load: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Load: no error, want %q", tt.want)
			}
			msg := err.Error()
			for _, w := range append(tt.want, path) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
			data, _ := os.ReadFile(path)
			for _, secret := range fixtureSecrets(t, data) {
				if strings.Contains(msg, secret) || strings.Contains(msg, secret[:7]) {
					t.Errorf("error %q contains (a prefix of) secret %q", msg, secret)
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	const p = "projects:\n  - name: a\n    api_key: k1\n    secret_key: s1\n"
	tests := []struct {
		name, in, want string
	}{
		{"no entries", "projects: []\norganizations: []\n", "no projects and no organizations"},
		{"second document", p + "---\nprojects: []\n", "line 5: more than one YAML document"},
		{"bad name", "projects:\n  - name: 'a b'\n    api_key: k\n    secret_key: s\n", "line 2: projects[0]: name has a character other than"},
		{"long name", "projects:\n  - name: " + strings.Repeat("n", MaxNameLen+1) + "\n    api_key: k\n    secret_key: s\n", "longer than 100 bytes"},
		{"missing api_key", "projects:\n  - name: a\n    secret_key: s\n", `project "a": api_key is empty or missing`},
		{"listed twice", p + "organizations:\n  - name: o\n    api_key: k\n    secret_key: s\n    projects: [a, a]\n", `organization "o": project "a" listed twice`},
		{"invalid listed name", p + "organizations:\n  - name: o\n    api_key: k\n    secret_key: s\n    projects: ['x y~MARK~']\n", "not a valid project name"},
		{"yaml duplicate key", "projects:\n  - name: a\n    api_key: k1\n    api_key: k2\n    secret_key: s\n", `mapping key "api_key" already defined`},
		{"url with query", "projects:\n  - name: a\n    api_key: k1\n    secret_key: s\n    scim_url: 'https://x.test/?token=q'\n", "scim_url: want"},
		{"ftp url", "projects:\n  - name: a\n    api_key: k1\n    secret_key: s\n    feedback_url: 'ftp://x.test/'\n", "feedback_url: want"},
		{"syntax", "projects:\n  - name: a\n   api_key: [\n", "line"},
		{"tracking plan", p[:len(p)-1] + "\n    tracking_plan: enforce\n", `tracking_plan "enforce": want off, observe, filter or block`},
		{"scalar secret as list item", "projects:\n  - sk-123456\n", "(value hidden)"},
		{"short scalar secret", "projects: sk-1\n", "(value hidden)"},
		{"secret-looking key", "projects:\n  - name: a\n    api_key: k1\n    secret_key: s\n    'sk live~MARK~': 1\n", "unknown key (not shown)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse([]byte(tt.in))
			if err == nil {
				t.Fatalf("Parse: no error, want %q", tt.want)
			}
			msg := err.Error()
			if !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not contain %q", msg, tt.want)
			}
			if !strings.HasPrefix(msg, "credentials: ") {
				t.Errorf("error %q lacks the credentials: prefix", msg)
			}
			for _, s := range []string{"k1", "k2", "sk-1", "sk-12", "~MARK~", "token=q"} {
				if strings.Contains(msg, s) {
					t.Errorf("error %q contains secret-ish %q", msg, s)
				}
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.yaml"))
	if !errorsIsNotExist(err) {
		t.Fatalf("Load of a missing file: %v, want os.ErrNotExist", err)
	}
}

func errorsIsNotExist(err error) bool { return err != nil && os.IsNotExist(unwrapAll(err)) }

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func TestLoadTooLarge(t *testing.T) {
	path := filepath.Join(t.TempDir(), "big.yaml")
	if err := os.WriteFile(path, []byte("# "+strings.Repeat("x", MaxFileBytes)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Fatalf("Load: %v, want a size error", err)
	}
}

func loadValid(t *testing.T) *Store {
	t.Helper()
	s, err := Load("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLookups(t *testing.T) {
	s := loadValid(t)

	web, ok := s.Project("web-prod")
	if !ok || web.Name != "web-prod" || web.APIKey.Reveal() != "proj-web-apikey-0001" || web.SecretKey.Reveal() != "proj-web-secretkey-0001" {
		t.Fatalf("Project(web-prod) = %v, %v", web, ok)
	}
	if _, ok := s.Project("Web-Prod"); ok {
		t.Error("names must match exactly")
	}
	ios, _ := s.Project("ios-prod")
	org := ios.Org()
	if org == nil || org.Name != "acme" || org.SCIMToken.Reveal() != "org-acme-scimtoken-0006" || org.ManagementAPIKey.Reveal() != "org-acme-mgmtkey-0005" {
		t.Fatalf("ios-prod's organization = %v", org)
	}
	if o2, _ := s.Organization("acme"); o2 != org || web.Org() != org {
		t.Error("Organization(acme) and web.Org() must be the same organization")
	}
	if lonely, _ := s.Project("lonely"); lonely.Org() != nil {
		t.Error("lonely is in no organization")
	}
	if p, ok := s.ProjectByAPIKey("proj-ios-apikey-0002"); !ok || p.Name != "ios-prod" {
		t.Errorf("ProjectByAPIKey = %v, %v", p, ok)
	}
	if _, ok := s.ProjectByAPIKey("proj-ios-secretkey-0002"); ok {
		t.Error("ProjectByAPIKey found a project by its secret key")
	}
	if got := len(s.Projects()); got != 3 {
		t.Errorf("Projects: %d, want 3", got)
	}
	if got := s.orgs; len(got) != 1 || got[0].Name != "acme" {
		t.Errorf("Organizations = %v", got)
	}
	s.Projects()[0] = nil
	if s.Projects()[0] == nil {
		t.Error("Projects returned the store's own slice")
	}

	var nilStore *Store
	if _, ok := nilStore.Project("web-prod"); ok {
		t.Error("nil store found a project")
	}
	if _, ok := nilStore.ProjectByAPIKey("proj-web-apikey-0001"); ok {
		t.Error("nil store found a key")
	}
	if _, ok := nilStore.Organization("acme"); ok || nilStore.Projects() != nil {
		t.Error("nil store is not empty")
	}
}

func TestURL(t *testing.T) {
	s := loadValid(t)
	web, _ := s.Project("web-prod")
	ios, _ := s.Project("ios-prod")
	lonely, _ := s.Project("lonely")
	const flag = "https://flag.example.test"
	tests := []struct {
		name string
		p    *Project
		kind string
		want string
	}{
		{"project override beats org", web, KindAnalytics, "https://analytics.eu.example.test"},
		{"org override when project has none", ios, KindAnalytics, "https://analytics.org.example.test"},
		{"org override of another kind", web, KindSCIM, "https://scim.org.example.test"},
		{"flag when neither", web, KindIngest, flag},
		{"project without org", lonely, KindIngest, "http://127.0.0.1:9999/base"},
		{"project without org, flag", lonely, KindAnalytics, flag},
		{"unknown kind", web, "analytic", flag},
		{"nil project", nil, KindAnalytics, flag},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.URL(tt.kind, flag); got != tt.want {
				t.Errorf("URL(%q) = %q, want %q", tt.kind, got, tt.want)
			}
		})
	}
	org, _ := s.Organization("acme")
	if got := org.URL(KindSCIM, flag); got != "https://scim.org.example.test" {
		t.Errorf("org URL = %q", got)
	}
	if got := (*Organization)(nil).URL(KindSCIM, flag); got != flag {
		t.Errorf("nil org URL = %q", got)
	}
	for _, k := range []string{KindIngest, KindAlias, KindAnalytics, KindExperiment, KindSCIM, KindFeedback} {
		u := URLs{Ingest: "i", Alias: "a", Analytics: "n", Experiment: "e", SCIM: "s", Feedback: "f"}
		if u.Get(k) == "" {
			t.Errorf("URLs.Get(%q) is empty", k)
		}
	}
}

func TestAuthHeaders(t *testing.T) {
	got := BasicAuth(NewSecret("key1"), NewSecret("sec:ret"))
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(got, "Basic "))
	if !strings.HasPrefix(got, "Basic ") || err != nil || string(raw) != "key1:sec:ret" {
		t.Errorf("BasicAuth = %q (%q, %v)", got, raw, err)
	}
	if got := Bearer(NewSecret("tok")); got != "Bearer tok" {
		t.Errorf("Bearer = %q", got)
	}
}

// TestNoSecretInOutput formats, marshals and logs everything the package
// hands out and checks that no secret of the file comes out.
func TestNoSecretInOutput(t *testing.T) {
	data, err := os.ReadFile("testdata/valid.yaml")
	if err != nil {
		t.Fatal(err)
	}
	secrets := fixtureSecrets(t, data)
	if len(secrets) < 9 {
		t.Fatalf("fixture secrets: %q", secrets)
	}
	s := loadValid(t)
	web, _ := s.Project("web-prod")
	org, _ := s.Organization("acme")

	values := map[string]any{
		"store": s, "*store": *s, "project": web, "*project": *web, "org": org, "*org": *org,
		"secret": web.SecretKey, "projects": s.Projects(), "orgs": s.orgs,
		"wrapped": struct {
			P *Project
			S Secret
			m map[string]*Project
			p Project
			s Secret
		}{web, org.SCIMToken, map[string]*Project{"w": web}, *web, web.APIKey},
	}
	var outs []string
	add := func(what, out string) { outs = append(outs, what+": "+out) }
	for name, v := range values {
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%10.3v", "%T"} {
			add(name+" "+verb, fmt.Sprintf(verb, v))
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Errorf("json.Marshal(%s): %v", name, err)
		}
		add(name+" json", string(b))
		y, err := yaml.Marshal(v)
		if err == nil {
			add(name+" yaml", string(y))
		}
	}
	if got := fmt.Sprint(web.APIKey); got != Redacted {
		t.Errorf("Secret prints %q, want %q", got, Redacted)
	}

	core, logs := observer.New(zapcore.DebugLevel)
	zl := zap.New(core)
	zl.Info("any", zap.Any("store", s), zap.Any("project", web), zap.Any("org", org), zap.Any("secret", web.APIKey),
		zap.Any("projects", s.Projects()))
	zl.Info("object", zap.Object("store", s), zap.Object("secret", org.ManagementAPIKey))
	zl.Info("reflect", zap.Reflect("store", s), zap.Reflect("project", web), zap.Reflect("org", org), zap.Reflect("secret", org.SCIMToken))
	zl.Info("stringer", zap.Stringer("secret", org.SecretKey), zap.Stringer("token", org.SCIMToken))
	// The observer keeps fields unencoded: encode them as JSON and console,
	// as the relay's loggers would.
	for _, enc := range []zapcore.Encoder{
		zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig()),
		zapcore.NewConsoleEncoder(zap.NewDevelopmentEncoderConfig()),
	} {
		for _, e := range logs.All() {
			buf, err := enc.EncodeEntry(e.Entry, e.Context)
			if err != nil {
				t.Fatalf("encode log entry: %v", err)
			}
			add("zap "+e.Message, buf.String())
			if e.Message == "object" && !strings.Contains(buf.String(), `"acme"`) {
				t.Errorf("the store logs without its organization's name: %s", buf)
			}
			buf.Free()
		}
	}
	if n := logs.Len(); n != 4 {
		t.Fatalf("logged %d entries", n)
	}

	var sb strings.Builder
	sl := slog.New(slog.NewJSONHandler(&sb, nil))
	sl.Info("slog", "secret", web.SecretKey, "project", web, "store", s, "org", org)
	add("slog", sb.String())

	for _, out := range outs {
		for _, secret := range secrets {
			if strings.Contains(out, secret) {
				t.Errorf("secret %q leaked in %s", secret, out)
			}
		}
	}
	// And the outputs say something useful.
	joined := strings.Join(outs, "\n")
	for _, want := range []string{"web-prod", "acme", Redacted, `"projects":["web-prod","ios-prod","lonely"]`} {
		if !strings.Contains(joined, want) {
			t.Errorf("no output contains %q", want)
		}
	}
}

func FuzzParse(f *testing.F) {
	fixtures, _ := filepath.Glob("testdata/*.yaml")
	for _, path := range fixtures {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		// Mark every secret so that a leak is visible in any error.
		re := regexp.MustCompile(`((?:proj|org)-[a-z-]+-[0-9]{4})`)
		f.Add(re.ReplaceAll(data, []byte("${1}~MARK~")))
	}
	f.Add([]byte("projects:\n  - name: a\n    api_key: 'x~MARK~y'\n    secret_key: ~MARK~\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			if s != nil {
				t.Fatal("store with error")
			}
			if strings.Contains(err.Error(), "~MARK~") {
				t.Fatalf("error leaks a marked value: %v", err)
			}
			return
		}
		names := map[string]bool{}
		for _, p := range s.Projects() {
			if p.Name == "" || p.APIKey.IsZero() || p.SecretKey.IsZero() || names[p.Name] {
				t.Fatalf("invalid project %v", p)
			}
			names[p.Name] = true
			if q, ok := s.ProjectByAPIKey(p.APIKey.Reveal()); !ok || q != p {
				t.Fatalf("api key of %s does not find it", p.Name)
			}
			if o := p.Org(); o != nil && !slices.Contains(o.Projects, p.Name) {
				t.Fatalf("%s's organization %s does not list it", p.Name, o.Name)
			}
		}
		for _, o := range s.orgs {
			for _, n := range o.Projects {
				if p, ok := s.Project(n); !ok || p.Org() != o {
					t.Fatalf("org %s lists %q which does not point back", o.Name, n)
				}
			}
		}
		out := fmt.Sprintf("%v %+v %#v", s, s.Projects(), s.orgs)
		if strings.Contains(out, "~MARK~") {
			t.Fatalf("formatting leaks a marked value: %s", out)
		}
	})
}

func BenchmarkProjectByAPIKey(b *testing.B) {
	s, err := Load("testdata/valid.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := s.ProjectByAPIKey("proj-ios-apikey-0002"); !ok {
			b.Fatal("not found")
		}
	}
}

func TestSecret(t *testing.T) {
	var zero Secret
	if !zero.IsZero() || zero.Reveal() != "" || !NewSecret("").IsZero() {
		t.Error("zero Secret is not empty")
	}
	s := NewSecret("abc")
	if s.IsZero() || s.Reveal() != "abc" {
		t.Error("Secret does not hold its value")
	}
	for _, out := range []string{s.String(), fmt.Sprintf("%v|%s|%q|%x|%d|%5.1s|%#v", s, s, s, s, s, s, s)} {
		if strings.Contains(out, "abc") || strings.Contains(out, "616263") {
			t.Errorf("Secret printed its value: %q", out)
		}
	}
}

func TestLoadReadableByOthers(t *testing.T) {
	const yaml = "projects:\n  - name: web\n    api_key: \"k\"\n    secret_key: \"s\"\n"
	for perm, want := range map[os.FileMode]bool{0o600: false, 0o640: true, 0o604: true, 0o400: false} {
		path := filepath.Join(t.TempDir(), "creds.yaml")
		if err := os.WriteFile(path, []byte(yaml), perm); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, perm); err != nil { // beat the umask
			t.Fatal(err)
		}
		s, err := Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if s.ReadableByOthers() != want {
			t.Errorf("mode %o: ReadableByOthers = %v, want %v", perm, s.ReadableByOthers(), want)
		}
	}
	if (*Store)(nil).ReadableByOthers() {
		t.Error("nil store readable")
	}
}

func TestRef(t *testing.T) {
	var nilRef *Ref
	if nilRef.Load() != nil {
		t.Fatal("nil Ref holds a store")
	}
	a, err := Parse([]byte("projects:\n  - name: a\n    api_key: \"ka\"\n    secret_key: \"s\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse([]byte("projects:\n  - name: b\n    api_key: \"kb\"\n    secret_key: \"s\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	r := NewRef(a)
	if _, ok := r.Load().Project("a"); !ok {
		t.Fatal("Load: not the first store")
	}
	if old := r.Swap(b); old != a {
		t.Fatal("Swap returned another store")
	}
	if _, ok := r.Load().Project("b"); !ok {
		t.Fatal("Load after Swap: not the new store")
	}
}

func TestParseTrackingPlan(t *testing.T) {
	s, err := Parse([]byte("projects:\n  - name: a\n    api_key: k1\n    secret_key: s1\n    tracking_plan: block\n  - name: b\n    api_key: k2\n    secret_key: s2\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := s.Project("a")
	b, _ := s.Project("b")
	if a.TrackingPlan != "block" || b.TrackingPlan != "" {
		t.Errorf("tracking plans %q, %q; want block and none", a.TrackingPlan, b.TrackingPlan)
	}
}
