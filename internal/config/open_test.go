package config

import (
	"reflect"
	"strings"
	"testing"
)

// The settings for browsers and the open internet: --cors-origins, --allowed-api-keys,
// --client-rate-limit, --anonymize-ip.

func TestOpenSettingsDefaults(t *testing.T) {
	c, err := Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.CORSOrigins != nil || c.AllowedAPIKeys != nil || c.AllowedKeysFromCredentials || c.ClientRateLimit != 0 || c.AnonymizeIP {
		t.Fatalf("defaults: %+v", c)
	}
	if k := c.IngestAllowedAPIKeys(nil); k != nil {
		t.Fatalf("default allow-list %q, want nil (every key)", k)
	}
}

func TestOpenSettingsFile(t *testing.T) {
	c, err := Load([]string{"--config", "testdata/open.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"https://www.example.com", "http://localhost:3000"}; !reflect.DeepEqual(c.CORSOrigins, want) {
		t.Errorf("CORSOrigins %q, want %q", c.CORSOrigins, want)
	}
	if want := []string{"key-1", "key-2"}; !reflect.DeepEqual(c.IngestAllowedAPIKeys(nil), want) {
		t.Errorf("allowed keys %q, want %q", c.IngestAllowedAPIKeys(nil), want)
	}
	if c.ClientRateLimit != 2.5 || !c.AnonymizeIP {
		t.Errorf("ClientRateLimit %v AnonymizeIP %v", c.ClientRateLimit, c.AnonymizeIP)
	}
	for _, w := range c.Warnings {
		if strings.Contains(w, "allowed-api-keys") {
			t.Errorf("warning with an allow-list set: %s", w)
		}
	}
}

func TestOpenSettingsFlagsAndEnv(t *testing.T) {
	c, err := Load([]string{"--cors-origins", "*", "--anonymize-ip"}, []string{"RELAY_CLIENT_RATE_LIMIT=10", "RELAY_ALLOWED_API_KEYS=a, b,,"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c.CORSOrigins, []string{"*"}) || !c.AnonymizeIP || c.ClientRateLimit != 10 ||
		!reflect.DeepEqual(c.AllowedAPIKeys, []string{"a", "b"}) {
		t.Fatalf("%+v", c)
	}
}

// TestOpenSettingsWarnsWithoutAllowList: browsers allowed but any api_key
// taken is what makes an open relay; say so at start.
func TestOpenSettingsWarnsWithoutAllowList(t *testing.T) {
	c, err := Load([]string{"--cors-origins", "https://www.example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, w := range c.Warnings {
		found = found || strings.Contains(w, "--cors-origins is set but allowed-api-keys is not")
	}
	if !found {
		t.Fatalf("no warning about the missing allow-list: %q", c.Warnings)
	}
}

func TestOpenSettingsFromCredentials(t *testing.T) {
	c, err := Load([]string{"--allowed-api-keys", "credentials", "--admin-token", "tok", "--credentials", "testdata/credentials.yaml"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !c.AllowedKeysFromCredentials || c.AllowedAPIKeys != nil {
		t.Fatalf("%+v", c)
	}
	if got := c.IngestAllowedAPIKeys(c.Creds); !reflect.DeepEqual(got, []string{"k"}) {
		t.Errorf("keys from the credentials file: %q", got)
	}
	if _, err := Load([]string{"--allowed-api-keys", "credentials"}, nil); err == nil || !strings.Contains(err.Error(), `--allowed-api-keys "credentials" needs the credentials setting`) {
		t.Errorf("credentials allow-list without a file: %v", err)
	}
}

func TestOpenSettingsInvalid(t *testing.T) {
	for _, args := range [][]string{
		{"--cors-origins", "www.example.com"},
		{"--cors-origins", "https://www.example.com/path"},
		{"--cors-origins", "*,https://www.example.com"},
		{"--client-rate-limit", "-1"},
		{"--client-rate-limit", "fast"},
		{"--client-rate-limit", "NaN"},
		{"--anonymize-ip=maybe"},
	} {
		if _, err := Load(args, nil); err == nil {
			t.Errorf("%q accepted", args)
		} else if !strings.HasPrefix(err.Error(), "--") {
			t.Errorf("%q: error %q does not name the flag", args, err)
		}
	}
}
