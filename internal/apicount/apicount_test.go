package apicount

import "testing"

func TestParseSumsCodesAndJoinsSubresources(t *testing.T) {
	text := `# HELP apiserver_request_total x
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="ipam.cluster.x-k8s.io",resource="ipaddressclaims",scope="resource",subresource="",verb="PATCH",version="v1beta2"} 7
apiserver_request_total{code="409",component="apiserver",dry_run="",group="ipam.cluster.x-k8s.io",resource="ipaddressclaims",scope="resource",subresource="",verb="PATCH",version="v1beta2"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="ipam.cluster.x-k8s.io",resource="ipaddressclaims",scope="resource",subresource="status",verb="PATCH",version="v1beta2"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="secrets",scope="resource",subresource="",verb="GET",version="v1"} 4
`
	c, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Get("PATCH", "ipaddressclaims"); got != 9 {
		t.Errorf("PATCH ipaddressclaims = %g, want 9 (200 and 409 summed)", got)
	}
	if got := c.Get("PATCH", "ipaddressclaims/status"); got != 3 {
		t.Errorf("PATCH ipaddressclaims/status = %g, want 3", got)
	}
	before := Counts{{"PATCH", "ipaddressclaims"}: 4}
	d := c.Since(before).WritesOnly()
	if d.Get("PATCH", "ipaddressclaims") != 5 || d.Get("GET", "secrets") != 0 || d.Total() != 8 {
		t.Errorf("writes since = %v", d)
	}
}
