package zygote

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"
)

type vectorFile struct {
	ProtocolVersion int `json:"protocol_version"`
	Vectors         []struct {
		Name      string          `json:"name"`
		Direction string          `json:"direction"`
		Hex       string          `json:"hex"`
		Message   json.RawMessage `json:"message"`
	} `json:"vectors"`
}

// normalJSON parses JSON with exact numbers, for comparing two documents.
func normalJSON(t *testing.T, data []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("parsing %s: %v", data, err)
	}
	return v
}

func strictUnmarshal(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// TestVectors decodes every shared vector with this package's decoder,
// compares the result with the vector's message, and encodes the message
// back to exactly the vector's bytes.
func TestVectors(t *testing.T) {
	checkVectors(t, filepath.Join("..", "..", "proto", "vectors", "frames.json"), protocolVersion, 20)
}

// TestVectorsOfOlderVersions checks the frozen frames of each older
// version with the layouts this package speaks to a daemon of that
// version.
func TestVectorsOfOlderVersions(t *testing.T) {
	for v := uint32(oldestProtocolVersion); v < protocolVersion; v++ {
		t.Run(fmt.Sprintf("v%d", v), func(t *testing.T) {
			checkVectors(t, filepath.Join("..", "..", "proto", "vectors", fmt.Sprintf("v%d", v), "frames.json"), v, 20)
		})
	}
}

func checkVectors(t *testing.T, path string, version uint32, atLeast int) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading the shared vectors: %v", err)
	}
	var file vectorFile
	if err := json.Unmarshal(data, &file); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
	if file.ProtocolVersion != int(version) {
		t.Fatalf("%s is for protocol %d, want %d", path, file.ProtocolVersion, version)
	}
	if len(file.Vectors) < atLeast {
		t.Fatalf("%s has only %d vectors", path, len(file.Vectors))
	}
	for _, v := range file.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			frame, err := hex.DecodeString(v.Hex)
			if err != nil {
				t.Fatalf("hex: %v", err)
			}
			var decoded, fromJSON any
			var reencoded []byte
			switch v.Direction {
			case "client":
				m, err := decodeClientIn(frame, version)
				if err != nil {
					t.Fatalf("decoding: %v", err)
				}
				var j clientMessage
				if err := strictUnmarshal(v.Message, &j); err != nil {
					t.Fatalf("message into Go: %v", err)
				}
				if reencoded, err = encodeClientTo(nil, &j, version); err != nil {
					t.Fatalf("encoding: %v", err)
				}
				decoded, fromJSON = m, &j
			case "server":
				m, err := decodeServerIn(frame, version)
				if err != nil {
					t.Fatalf("decoding: %v", err)
				}
				var j serverMessage
				if err := strictUnmarshal(v.Message, &j); err != nil {
					t.Fatalf("message into Go: %v", err)
				}
				if reencoded, err = encodeServerIn(&j, version); err != nil {
					t.Fatalf("encoding: %v", err)
				}
				decoded, fromJSON = m, &j
			default:
				t.Fatalf("unknown direction %q", v.Direction)
			}
			if !reflect.DeepEqual(decoded, fromJSON) {
				t.Errorf("decode(hex) = %+v, message = %+v", decoded, fromJSON)
			}
			out, err := json.Marshal(decoded)
			if err != nil {
				t.Fatalf("decoded value to JSON: %v", err)
			}
			got := withoutNewerFields(normalJSON(t, out), version)
			if want := normalJSON(t, v.Message); !reflect.DeepEqual(got, want) {
				t.Errorf("decoded value as JSON:\n got %s\nwant %s", out, v.Message)
			}
			if got := hex.EncodeToString(reencoded); got != v.Hex {
				t.Errorf("encode(message):\n got %s\nwant %s", got, v.Hex)
			}
		})
	}
}

// withoutNewerFields drops, from a message's JSON, the fields that the
// layout of version v does not have.
func withoutNewerFields(message any, v uint32) any {
	if v >= sandboxSince {
		return message
	}
	m, ok := message.(map[string]any)
	if !ok {
		return message
	}
	for variant, fields := range map[string][]string{"Spawn": {"sandbox"}, "Spawned": {"sandbox"},
		"Status": {"peers", "spawners"}} {
		if body, ok := m[variant].(map[string]any); ok {
			for _, f := range fields {
				delete(body, f)
			}
		}
	}
	return m
}

// TestDecoderRejects checks the malformed frames of PROTOCOL.md §3.
func TestDecoderRejects(t *testing.T) {
	for _, tc := range []struct {
		name, hex string
	}{
		{"empty", ""},
		{"unknown variant", "0a"},
		{"trailing byte", "040800"},
		{"ends early", "0408ff"},
		{"u32 too long", "0001ffffffff1f"},
		{"u64 too long", "04ffffffffffffffffff02"},
		{"bad bool", "030700000000000002"},
		{"invalid UTF-8", "0602" + "01ff"},
		{"length beyond frame", "0602" + "05ff"},
		{"unknown stage", "0209" + "7f" + "0400"},
	} {
		frame, err := hex.DecodeString(tc.hex)
		if err != nil {
			t.Fatal(err)
		}
		if m, err := decodeServer(frame); err == nil {
			t.Errorf("%s: decoded %+v, want an error", tc.name, m)
		}
	}
	// A client frame: spawn_minimal with an argv0 option tag of 2.
	if m, err := decodeClient([]byte{0x01, 0x07, 0x01, 0x78, 0x02}); err == nil {
		t.Errorf("bad option tag: decoded %+v", m)
	}
	// Over-long varints are accepted, as the reference decoder does.
	if m, err := decodeServer([]byte{0x04, 0x88, 0x00}); err != nil || m.SignalSent.ID != 8 {
		t.Errorf("over-long varint: %+v, %v", m, err)
	}
}

// TestCachedEncodingMatches checks the encodings a request reuses (the
// inherited environment, the copied resource limits) against encoding
// the same request from scratch, and that a changed environment or an
// rlimit override is encoded anew.
func TestCachedEncodingMatches(t *testing.T) {
	c := &Client{}
	encode := func(cmd *Cmd) (*spawnRequest, []byte, []byte) {
		t.Helper()
		p, err := cmd.build(true)
		if err != nil {
			t.Fatal(err)
		}
		req := p.req
		cached, err := encodeClient(&clientMessage{Spawn: req})
		if err != nil {
			t.Fatal(err)
		}
		plain := *req
		plain.envEncoded, plain.rlimitsEncoded = nil, nil
		fresh, err := encodeClient(&clientMessage{Spawn: &plain})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(cached, fresh) {
			t.Fatalf("the cached encoding differs from a fresh one:\n%x\n%x", cached, fresh)
		}
		return req, cached, fresh
	}
	envOf := func(frame []byte) map[string]string {
		t.Helper()
		m, err := decodeClient(frame)
		if err != nil {
			t.Fatal(err)
		}
		env := map[string]string{}
		for _, v := range m.Spawn.Env {
			env[string(v.Key)] = string(v.Value)
		}
		return env
	}

	t.Setenv("ZYGOTE_GO_ENCTEST", "one")
	req, frame, _ := encode(c.Command("/bin/true"))
	if req.envEncoded == nil || req.rlimitsEncoded == nil {
		t.Fatalf("an inheriting request reuses no encoding (env %v, rlimits %v)", req.envEncoded != nil, req.rlimitsEncoded != nil)
	}
	if got := envOf(frame)["ZYGOTE_GO_ENCTEST"]; got != "one" {
		t.Fatalf("ZYGOTE_GO_ENCTEST=%q, want one", got)
	}
	os.Setenv("ZYGOTE_GO_ENCTEST", "two")
	if _, frame, _ = encode(c.Command("/bin/true")); envOf(frame)["ZYGOTE_GO_ENCTEST"] != "two" {
		t.Fatalf("after Setenv the request has ZYGOTE_GO_ENCTEST=%q, want two", envOf(frame)["ZYGOTE_GO_ENCTEST"])
	}

	// An explicit environment and an rlimit override are encoded per request.
	cmd := c.Command("/bin/true")
	cmd.Env = []string{"A=1"}
	cmd.Zygote.Rlimits = []Rlimit{{Resource: syscall.RLIMIT_NOFILE, Cur: 77, Max: 77}}
	req, frame, _ = encode(cmd)
	if req.envEncoded != nil || req.rlimitsEncoded != nil {
		t.Fatal("a request with its own Env and Rlimits reused a cached encoding")
	}
	m, err := decodeClient(frame)
	if err != nil {
		t.Fatal(err)
	}
	if env := envOf(frame); len(env) != 1 || env["A"] != "1" {
		t.Fatalf("env %v, want only A=1", env)
	}
	found := false
	for _, l := range m.Spawn.Rlimits {
		if l.Resource == syscall.RLIMIT_NOFILE {
			found = l.Soft == 77 && l.Hard == 77
		}
	}
	if !found {
		t.Fatalf("rlimits %+v lack the override NOFILE 77/77", m.Spawn.Rlimits)
	}
}

// TestGetwdLongPath checks rawGetwd past its small first buffer.
func TestGetwdLongPath(t *testing.T) {
	// getcwd reports the path with symlinks resolved.
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	deep := dir
	for len(deep) < 600 {
		deep = filepath.Join(deep, "a-directory-name-of-forty-characters-xx")
	}
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	old, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, deep} {
		if err := os.Chdir(d); err != nil {
			t.Fatal(err)
		}
		got, err := rawGetwd()
		os.Chdir(old)
		if err != nil || got != d {
			t.Fatalf("rawGetwd in %s (%d bytes): %q, %v", d, len(d), got, err)
		}
	}
}
