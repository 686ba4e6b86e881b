package zygote

// The warm templates' wire types (PROTOCOL.md, version 4): the requests
// Template, SpawnFromTemplate and ListTemplates and the replies
// TemplateReady and Templates, with their encoders and decoders. Like the
// rest of the codec, each type mirrors the Rust type of the same name and
// has serde's JSON form.

import "fmt"

// pythonTemplate is the kind of template the daemon offers today.
const pythonTemplate = "python"

type templateRequest struct {
	ID          uint64   `json:"id"`
	Kind        string   `json:"kind"`
	Interpreter bstr     `json:"interpreter"`
	Preload     []string `json:"preload"`
	Env         []envVar `json:"env"`
	Cwd         optBytes `json:"cwd"`
}

type templateReady struct {
	ID       uint64 `json:"id"`
	Template uint64 `json:"template"`
	Pid      int32  `json:"pid"`
	Reused   bool   `json:"reused"`
}

// templateSpawnRequest starts a child from a template; its replies carry
// Spawn.ID.
type templateSpawnRequest struct {
	Template uint64       `json:"template"`
	Spawn    spawnRequest `json:"spawn"`
}

type templateListRequest struct {
	ID uint64 `json:"id"`
}

type templateList struct {
	ID        uint64         `json:"id"`
	Templates []templateInfo `json:"templates"`
}

type templateInfo struct {
	Template    uint64   `json:"template"`
	UID         uint32   `json:"uid"`
	Pid         int32    `json:"pid"`
	Kind        string   `json:"kind"`
	Interpreter bstr     `json:"interpreter"`
	Preload     []string `json:"preload"`
	Forks       uint64   `json:"forks"`
	Restarts    uint64   `json:"restarts"`
	AgeMillis   uint64   `json:"age_millis"`
	RssBytes    uint64   `json:"rss_bytes"`
}

// ---- encoding ----

func (e *encoder) strList(l []string) {
	e.varint(uint64(len(l)))
	for _, s := range l {
		e.bytes(strBytes(s))
	}
}

// templateMessage encodes one of the version-4 client messages, variant
// index included.
func (e *encoder) templateMessage(m *clientMessage, v uint32) error {
	switch {
	case m.Template != nil:
		r := m.Template
		e.varint(5)
		e.varint(r.ID)
		e.bytes(strBytes(r.Kind))
		e.bytes(r.Interpreter)
		e.strList(r.Preload)
		e.env(r.Env)
		if e.option(r.Cwd != nil) {
			e.bytes(r.Cwd)
		}
	case m.SpawnFromTemplate != nil:
		e.varint(6)
		e.varint(m.SpawnFromTemplate.Template)
		return e.spawn(&m.SpawnFromTemplate.Spawn, v)
	case m.ListTemplates != nil:
		e.varint(7)
		e.varint(m.ListTemplates.ID)
	}
	return nil
}

// errTemplatesVersion is a template message encoded for a connection
// whose version has no such message: refused, never sent (a daemon of
// that version would close the connection).
func errTemplatesVersion(v uint32) error {
	return fmt.Errorf("zygote: templates need protocol version %d; the connection speaks %d", templatesSince, v)
}

// ---- decoding ----

func (d *decoder) templateList() *templateList {
	l := &templateList{ID: d.u64("id")}
	n := d.count("templates")
	l.Templates = make([]templateInfo, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		l.Templates = append(l.Templates, templateInfo{Template: d.u64("template"), UID: d.u32("uid"),
			Pid: d.i32("pid"), Kind: d.str("kind"), Interpreter: d.bytes("interpreter"),
			Preload: d.strList("preload"), Forks: d.u64("forks"), Restarts: d.u64("restarts"),
			AgeMillis: d.u64("age_millis"), RssBytes: d.u64("rss_bytes")})
	}
	return l
}
