package deploy

import (
	"fmt"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// TestFleetManifest checks kubernetes/fleet.yaml beyond the structure
// TestKubernetesManifests checks in every file: the NATS StatefulSet is a
// 3-node JetStream cluster on its volumes whose nats.conf the real
// nats-server parses (each pod's name as server_name, file store on the
// claimed volume, routes to every pod through the headless Service, the
// ports the probes and Services use, fsync per write as the relay's
// default --sync always wants); the relay Deployment runs 2+ replicas whose
// --spool names every NATS pod on its client port.
func TestFleetManifest(t *testing.T) {
	docs := readManifest(t, "kubernetes/fleet.yaml")
	byKind := map[string][]k8sDoc{}
	for _, d := range docs {
		byKind[d.str("kind")] = append(byKind[d.str("kind")], d)
	}
	var sts, dep k8sDoc
	for _, d := range byKind["StatefulSet"] {
		if d.str("metadata", "name") == "nats" {
			sts = d
		}
	}
	for _, d := range byKind["Deployment"] {
		for _, c := range list(dig(map[string]any(d), "spec", "template", "spec", "containers")) {
			if c["name"] == "relay" {
				dep = d
			}
		}
	}
	if sts == nil || dep == nil {
		t.Fatalf("want a StatefulSet nats and a Deployment with a relay container; kinds %v", slices.Collect(maps.Keys(byKind)))
	}

	// The NATS StatefulSet.
	replicas, _ := dig(map[string]any(sts), "spec", "replicas").(int)
	if replicas != 3 {
		t.Errorf("nats replicas %d, want 3 (R3 streams, a quorum of 2)", replicas)
	}
	svcName := sts.str("spec", "serviceName")
	headless := false
	for _, s := range byKind["Service"] {
		if s.str("metadata", "name") == svcName && s.str("spec", "clusterIP") == "None" {
			headless = true
		}
	}
	if !headless {
		t.Errorf("serviceName %q is no headless Service of the file", svcName)
	}
	claims := map[string]bool{}
	for _, v := range list(dig(map[string]any(sts), "spec", "volumeClaimTemplates")) {
		claims[dig(v, "metadata", "name").(string)] = true
	}
	pod, _ := dig(map[string]any(sts), "spec", "template", "spec").(map[string]any)
	var nats map[string]any
	for _, c := range list(pod["containers"]) {
		if c["name"] == "nats" {
			nats = c
		}
	}
	if nats == nil {
		t.Fatal("no container nats in the StatefulSet")
	}
	ports := map[string]int{}
	for _, p := range list(nats["ports"]) {
		ports[p["name"].(string)], _ = p["containerPort"].(int)
	}
	dataMount := ""
	configMount := ""
	for _, m := range list(nats["volumeMounts"]) {
		if claims[m["name"].(string)] {
			dataMount = m["mountPath"].(string)
		}
		for _, v := range list(pod["volumes"]) {
			if v["name"] == m["name"] && dig(v, "configMap", "name") != nil {
				configMount = m["mountPath"].(string)
			}
		}
	}
	if dataMount == "" {
		t.Error("the nats container mounts no volume claim: JetStream's file store would not survive the pod")
	}
	for _, probe := range []string{"startupProbe", "livenessProbe", "readinessProbe"} {
		get, _ := dig(nats, probe, "httpGet").(map[string]any)
		if get == nil || get["port"] != "monitor" || !strings.HasPrefix(fmt.Sprint(get["path"]), "/healthz") {
			t.Errorf("nats %s: %v, want an httpGet of /healthz on the monitor port", probe, get)
		}
	}
	var envName string
	for _, e := range list(nats["env"]) {
		if dig(e, "valueFrom", "fieldRef", "fieldPath") == "metadata.name" {
			envName = e["name"].(string)
		}
	}

	// nats.conf, parsed by nats-server itself as pod nats-1 would.
	var conf string
	for _, cm := range byKind["ConfigMap"] {
		if c, ok := dig(map[string]any(cm), "data", "nats.conf").(string); ok {
			conf = c
		}
	}
	args := fmt.Sprint(nats["args"])
	if conf == "" || configMount == "" || !strings.Contains(args, configMount+"/nats.conf") {
		t.Fatalf("nats.conf: a ConfigMap key mounted at %q and named by the args %s wanted", configMount, args)
	}
	if envName == "" {
		t.Fatal("the nats container has no variable holding the pod's name (for server_name)")
	}
	t.Setenv(envName, "nats-1")
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects nats.conf: %v", err)
	}
	if opts.ServerName != "nats-1" {
		t.Errorf("server_name %q, want the pod's name", opts.ServerName)
	}
	if !opts.JetStream || !strings.HasPrefix(opts.StoreDir, dataMount+"/") && opts.StoreDir != dataMount {
		t.Errorf("jetstream %v, store_dir %q: want JetStream on the volume mounted at %s", opts.JetStream, opts.StoreDir, dataMount)
	}
	if opts.Port != ports["client"] || opts.HTTPPort != ports["monitor"] || opts.Cluster.Port != ports["cluster"] {
		t.Errorf("nats.conf ports client %d, monitor %d, cluster %d; container ports %v", opts.Port, opts.HTTPPort, opts.Cluster.Port, ports)
	}
	var wantRoutes, gotRoutes []string
	for i := range replicas {
		wantRoutes = append(wantRoutes, fmt.Sprintf("nats-%d.%s:%d", i, svcName, ports["cluster"]))
	}
	for _, r := range opts.Routes {
		gotRoutes = append(gotRoutes, r.Host)
	}
	if !slices.Equal(gotRoutes, wantRoutes) {
		t.Errorf("routes %v, want every pod %v", gotRoutes, wantRoutes)
	}
	if opts.Cluster.Name == "" {
		t.Error("no cluster name")
	}

	// The relay Deployment.
	relays, _ := dig(map[string]any(dep), "spec", "replicas").(int)
	if relays < 2 {
		t.Errorf("relay replicas %d, want 2 or more", relays)
	}
	env := map[string]string{}
	for _, c := range list(dig(map[string]any(dep), "spec", "template", "spec", "containers")) {
		if c["name"] == "relay" {
			for _, e := range list(c["env"]) {
				env[e["name"].(string)] = fmt.Sprint(e["value"])
			}
		}
	}
	spool := env["RELAY_SPOOL"]
	u, err := url.Parse(strings.SplitN(spool, ",", 2)[0])
	if err != nil || u.Scheme != "nats" {
		t.Fatalf("RELAY_SPOOL %q: want nats://...", spool)
	}
	hosts := strings.Split(strings.TrimPrefix(spool, "nats://"), ",")
	var want []string
	for i := range replicas {
		want = append(want, fmt.Sprintf("nats-%d.%s:%d", i, svcName, ports["client"]))
	}
	if !slices.Equal(hosts, want) {
		t.Errorf("RELAY_SPOOL hosts %v, want every NATS pod %v", hosts, want)
	}
	if p, err := strconv.Atoi(env["RELAY_SPOOL_PARTITIONS"]); err != nil || p < 2*relays {
		t.Errorf("RELAY_SPOOL_PARTITIONS %q: set it, well above the relays", env["RELAY_SPOOL_PARTITIONS"])
	}
	if sync := env["RELAY_SYNC"]; (sync == "" || sync == "always") && !opts.SyncAlways {
		t.Errorf("the relays promise --sync always but nats.conf has sync_interval %v (0: the server's default, 2 min)", opts.SyncInterval)
	}
}
