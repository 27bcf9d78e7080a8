package credentials

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/svcrelay/relay/internal/baseurl"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.yaml.in/yaml/v3"
)

// Upstream base kinds, as named by the --*-url flags and the file's *_url keys.
const (
	KindIngest     = "ingest"     // --ingest-url, ingest_url
	KindAlias      = "alias"      // --alias-url, alias_url
	KindAnalytics  = "analytics"  // --analytics-url, analytics_url
	KindExperiment = "experiment" // --experiment-url, experiment_url
	KindSCIM       = "scim"       // --scim-url, scim_url
	KindFeedback   = "feedback"   // --feedback-url, feedback_url
)

// MaxFileBytes is the largest credentials file Load reads.
const MaxFileBytes = 1 << 20

// URLs are optional upstream bases that override the --*-url flags. Each
// field's zero value ("") means no override. They are not secret.
type URLs struct {
	Ingest     string `yaml:"ingest_url"`
	Alias      string `yaml:"alias_url"`
	Analytics  string `yaml:"analytics_url"`
	Experiment string `yaml:"experiment_url"`
	SCIM       string `yaml:"scim_url"`
	Feedback   string `yaml:"feedback_url"`
}

// Get returns the base of kind (one of the Kind constants); "" when unset or
// kind is unknown.
func (u URLs) Get(kind string) string {
	for _, f := range u.fields() {
		if f.kind == kind {
			return f.v
		}
	}
	return ""
}

// fields are u's bases by kind; a kind's file key is kind + "_url".
func (u URLs) fields() [6]struct{ kind, v string } {
	return [...]struct{ kind, v string }{
		{KindIngest, u.Ingest}, {KindAlias, u.Alias}, {KindAnalytics, u.Analytics},
		{KindExperiment, u.Experiment}, {KindSCIM, u.SCIM}, {KindFeedback, u.Feedback},
	}
}

// Project is one entry of the file's projects list. Its fields are read-only
// after Load.
type Project struct {
	Name      string // what X-Relay-Project names; never empty
	APIKey    Secret // never empty
	SecretKey Secret // never empty
	URLs      URLs   // per-project upstream bases; zero fields mean none
	// TrackingPlan is the project's tracking-plan mode (off, observe,
	// filter, block); "" means the --tracking-plan default.
	TrackingPlan string

	org *Organization // nil when no organization lists the project
}

// Organization is one entry of the file's organizations list. Its fields are
// read-only after Load.
type Organization struct {
	Name             string   // never empty
	APIKey           Secret   // organization key pair (DSAR); never empty
	SecretKey        Secret   // never empty
	ManagementAPIKey Secret   // experiment management; zero means not configured
	SCIMToken        Secret   // SCIM provisioning; zero means not configured
	URLs             URLs     // organization-wide upstream bases; zero fields mean none
	Projects         []string // names of its projects, each in exactly one organization
}

// Org returns the organization listing p, or nil.
func (p *Project) Org() *Organization { return p.org }

// URL returns the upstream base of kind (one of the Kind constants) for p:
// the project's own override, else its organization's, else fallback (the
// --*-url flag). A nil p returns fallback.
func (p *Project) URL(kind, fallback string) string {
	if p == nil {
		return fallback
	}
	return cmp.Or(p.URLs.Get(kind), p.org.URL(kind, fallback))
}

// URL returns the organization's base of kind, else fallback. A nil o
// returns fallback.
func (o *Organization) URL(kind, fallback string) string {
	if o == nil {
		return fallback
	}
	return cmp.Or(o.URLs.Get(kind), fallback)
}

// Store is the parsed credentials file. A nil *Store holds no credentials:
// every lookup reports false. It is immutable and safe for concurrent use.
type Store struct {
	projects []*Project // file order
	orgs     []*Organization
	byName   map[string]*Project
	orgName  map[string]*Organization
	byKey    map[[sha256.Size]byte]*Project // by sha256 of api_key, so no raw key sits in a map

	readableByOthers bool // loaded from a file group or others may read
}

// ReadableByOthers reports whether the Store was loaded from a file that
// group or others may read (mode & 0o044): the caller should warn, as for
// the admin token file. False for a nil Store and one from Parse.
func (s *Store) ReadableByOthers() bool { return s != nil && s.readableByOthers }

// Ref holds the Store in force, for readers that must see a new one after a
// reload (SIGHUP) without a restart: Load in every request, Swap to replace.
// A nil *Ref, like a Ref holding nil, holds no credentials. Safe for
// concurrent use.
type Ref struct{ p atomic.Pointer[Store] }

// NewRef returns a Ref holding s (which may be nil).
func NewRef(s *Store) *Ref {
	r := &Ref{}
	r.p.Store(s)
	return r
}

// Load returns the Store in force (nil: none).
func (r *Ref) Load() *Store {
	if r == nil {
		return nil
	}
	return r.p.Load()
}

// Swap puts s in force for every later Load and returns the Store it replaces.
func (r *Ref) Swap(s *Store) *Store { return r.p.Swap(s) }

// Project returns the project named name (the X-Relay-Project value).
func (s *Store) Project(name string) (*Project, bool) {
	if s == nil {
		return nil, false
	}
	p, ok := s.byName[name]
	return p, ok
}

// Organization returns the organization named name.
func (s *Store) Organization(name string) (*Organization, bool) {
	if s == nil {
		return nil, false
	}
	o, ok := s.orgName[name]
	return o, ok
}

// ProjectByAPIKey returns the project whose api_key is key (api keys are
// unique in a valid file). The lookup is a map access, not constant time.
func (s *Store) ProjectByAPIKey(key string) (*Project, bool) {
	if s == nil {
		return nil, false
	}
	p, ok := s.byKey[sha256.Sum256([]byte(key))]
	return p, ok
}

// Projects returns the projects in file order (a new slice).
func (s *Store) Projects() []*Project {
	if s == nil {
		return nil
	}
	return append([]*Project(nil), s.projects...)
}

// file is the YAML shape.
type file struct {
	Projects      []fileProject `yaml:"projects"`
	Organizations []fileOrg     `yaml:"organizations"`
}

type fileProject struct {
	Name      string `yaml:"name"`
	APIKey    string `yaml:"api_key"`
	SecretKey string `yaml:"secret_key"`
	// TrackingPlan: see Project.TrackingPlan.
	TrackingPlan string `yaml:"tracking_plan"`
	URLs         `yaml:",inline"`
}

type fileOrg struct {
	Name             string   `yaml:"name"`
	APIKey           string   `yaml:"api_key"`
	SecretKey        string   `yaml:"secret_key"`
	ManagementAPIKey string   `yaml:"management_api_key"`
	SCIMToken        string   `yaml:"scim_token"`
	Projects         []string `yaml:"projects"`
	URLs             `yaml:",inline"`
}

// Load reads and parses the credentials file at path (see Parse). Errors name
// the file and line but never contain a secret value.
func Load(path string) (*Store, error) {
	data, readable, err := ReadSecretFile(path, MaxFileBytes)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	s, err := parse(data, path)
	if err != nil {
		return nil, err
	}
	s.readableByOthers = readable
	return s, nil
}

// Parse parses a credentials file (the shape of the contract's "Admin
// listener" section). It fails, with an error naming the line and never a
// secret value, on: a YAML error; an unknown key; a second YAML document; a
// file with no project and no organization; an empty or malformed name, or
// one used twice; an empty api_key or secret_key; two projects with the same
// api_key; an upstream base that is not an http(s) URL without user info,
// query or fragment; an organization naming an unknown project; a project
// listed by two organizations (or twice by one).
func Parse(data []byte) (*Store, error) { return parse(data, "") }

func parse(data []byte, path string) (*Store, error) {
	fail := func(line int, format string, a ...any) error {
		msg := fmt.Sprintf(format, a...)
		if line > 0 {
			msg = fmt.Sprintf("line %d: %s", line, msg)
		}
		if path != "" {
			return fmt.Errorf("credentials %s: %s", path, msg)
		}
		return errors.New("credentials: " + msg)
	}

	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f file
	if err := dec.Decode(&f); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fail(0, "empty file: want projects and organizations")
		}
		return nil, fail(0, "%s", yamlError(err))
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fail(extra.Line, "more than one YAML document")
	}
	if len(f.Projects) == 0 && len(f.Organizations) == 0 {
		return nil, fail(0, "no projects and no organizations")
	}
	projLines, orgLines := itemLines(data)

	s := &Store{
		byName:  make(map[string]*Project, len(f.Projects)),
		orgName: make(map[string]*Organization, len(f.Organizations)),
		byKey:   make(map[[sha256.Size]byte]*Project, len(f.Projects)),
	}
	for i, fp := range f.Projects {
		line := lineOf(projLines, i)
		_, dup := s.byName[fp.Name]
		what, err := checkEntry("projects", i, fp.Name, dup, fp.APIKey, fp.SecretKey, fp.URLs)
		if err != nil {
			return nil, fail(line, "%v", err)
		}
		keySum := sha256.Sum256([]byte(fp.APIKey))
		if other, dup := s.byKey[keySum]; dup {
			return nil, fail(line, "%s: api_key is the same as project %q's", what, other.Name)
		}
		switch fp.TrackingPlan {
		case "", "off", "observe", "filter", "block":
		default:
			return nil, fail(line, "%s: tracking_plan %q: want off, observe, filter or block", what, fp.TrackingPlan)
		}
		p := &Project{Name: fp.Name, APIKey: NewSecret(fp.APIKey), SecretKey: NewSecret(fp.SecretKey), URLs: fp.URLs,
			TrackingPlan: fp.TrackingPlan}
		s.projects = append(s.projects, p)
		s.byName[p.Name] = p
		s.byKey[keySum] = p
	}
	for i, fo := range f.Organizations {
		line := lineOf(orgLines, i)
		_, dup := s.orgName[fo.Name]
		what, err := checkEntry("organizations", i, fo.Name, dup, fo.APIKey, fo.SecretKey, fo.URLs)
		if err != nil {
			return nil, fail(line, "%v", err)
		}
		o := &Organization{
			Name: fo.Name, APIKey: NewSecret(fo.APIKey), SecretKey: NewSecret(fo.SecretKey),
			ManagementAPIKey: NewSecret(fo.ManagementAPIKey), SCIMToken: NewSecret(fo.SCIMToken),
			URLs: fo.URLs, Projects: append([]string(nil), fo.Projects...),
		}
		for _, name := range fo.Projects {
			p, ok := s.byName[name]
			switch {
			case !ok && checkName(name) != nil:
				return nil, fail(line, "%s: projects lists a name that is not a valid project name", what)
			case !ok:
				return nil, fail(line, "%s: project %q is not in projects", what, name)
			case p.org == o:
				return nil, fail(line, "%s: project %q listed twice", what, name)
			case p.org != nil:
				return nil, fail(line, "%s: project %q is already in organization %q", what, name, p.org.Name)
			}
			p.org = o
		}
		s.orgs = append(s.orgs, o)
		s.orgName[o.Name] = o
	}
	return s, nil
}

// MaxNameLen is the longest project or organization name.
const MaxNameLen = 100

// checkName accepts 1 to MaxNameLen letters, digits, '.', '_' and '-': a
// name travels in a header and appears in logs and metrics.
func checkName(name string) error {
	if name == "" {
		return errors.New("is empty or missing")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("is longer than %d bytes", MaxNameLen)
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			// Not echoed: a misplaced line could put a secret here.
			return errors.New("has a character other than letters, digits, '.', '_' and '-'")
		}
	}
	return nil
}

// checkEntry checks what projects and organizations share: the name (dup:
// used before), the key pair and the base URLs of entry i of list. It
// returns how errors name the entry.
func checkEntry(list string, i int, name string, dup bool, apiKey, secretKey string, urls URLs) (string, error) {
	if err := checkName(name); err != nil {
		return "", fmt.Errorf("%s[%d]: name %v", list, i, err)
	}
	what := fmt.Sprintf("%s %q", strings.TrimSuffix(list, "s"), name)
	switch {
	case dup:
		return "", fmt.Errorf("%s: name used twice", what)
	case apiKey == "":
		return "", fmt.Errorf("%s: api_key is empty or missing", what)
	case secretKey == "":
		return "", fmt.Errorf("%s: secret_key is empty or missing", what)
	}
	return what, checkURLs(what, urls)
}

// checkURLs accepts upstream bases (baseurl.Parse) without user info. The
// value is not echoed: it could hold user info.
func checkURLs(what string, u URLs) error {
	for _, f := range u.fields() {
		if f.v == "" {
			continue
		}
		if p, ok := baseurl.Parse(f.v); !ok || p.User != nil {
			return fmt.Errorf("%s: %s_url: want an http:// or https:// base URL without user info, query or fragment", what, f.kind)
		}
	}
	return nil
}

var (
	// yaml quotes (a prefix of) the offending scalar in backquotes: it may
	// be a secret.
	quotedValue = regexp.MustCompile("`[^`]*`")
	unknownKey  = regexp.MustCompile(`^line (\d+): field (.*) not found in type credentials\.file(Project|Org|)$`)
	plainKey    = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// yamlError rewrites a yaml error so that it names keys and lines but no
// value.
func yamlError(err error) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return quotedValue.ReplaceAllString(err.Error(), "(value hidden)")
	}
	msgs := make([]string, 0, len(te.Errors))
	for _, m := range te.Errors {
		if sm := unknownKey.FindStringSubmatch(m); sm != nil {
			where := map[string]string{"Project": "a project", "Org": "an organization", "": "the top-level mapping"}[sm[3]]
			key := sm[2]
			if !plainKey.MatchString(key) {
				key = "(not shown)"
			} else {
				key = fmt.Sprintf("%q", key)
			}
			msgs = append(msgs, fmt.Sprintf("line %s: unknown key %s in %s", sm[1], key, where))
			continue
		}
		m = strings.ReplaceAll(m, "credentials.fileProject", "a project")
		m = strings.ReplaceAll(m, "credentials.fileOrg", "an organization")
		msgs = append(msgs, quotedValue.ReplaceAllString(m, "(value hidden)"))
	}
	return strings.Join(msgs, "; ")
}

// itemLines returns the line of each item of the top-level projects and
// organizations lists (best effort: nil when the shape is unexpected).
func itemLines(data []byte) (projects, orgs []int) {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil, nil
	}
	m := root.Content[0].Content
	for i := 0; i+1 < len(m); i += 2 {
		var lines []int
		for _, n := range m[i+1].Content {
			lines = append(lines, n.Line)
		}
		switch m[i].Value {
		case "projects":
			projects = lines
		case "organizations":
			orgs = lines
		}
	}
	return projects, orgs
}

func lineOf(lines []int, i int) int {
	if i < len(lines) {
		return lines[i]
	}
	return 0
}

// Format prints the project and organization names only.
func (s Store) Format(f fmt.State, verb rune) {
	ps, orgs := s.Names()
	fmt.Fprintf(f, "credentials.Store{Projects:%q Organizations:%q}", ps, orgs)
}

// Names returns the project and organization names, in file order.
func (s *Store) Names() (projects, orgs []string) {
	if s == nil {
		return nil, nil
	}
	for _, p := range s.projects {
		projects = append(projects, p.Name)
	}
	for _, o := range s.orgs {
		orgs = append(orgs, o.Name)
	}
	return projects, orgs
}

// MarshalLogObject logs the project and organization names, no secret.
func (s *Store) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	ps, orgs := s.Names()
	zap.Strings("projects", ps).AddTo(enc)
	zap.Strings("organizations", orgs).AddTo(enc)
	return nil
}
