package zygote

import (
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// scriptedPeer listens on a socket and answers each connection's frames
// with script: the real daemon never sends a wrong or malformed reply, so
// these paths need a peer that does.
func scriptedPeer(t *testing.T, script func(conn *net.UnixConn, frame []byte) [][]byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "peer.sock")
	l, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				buf := make([]byte, 1<<18+1)
				for {
					n, _, _, _, err := conn.ReadMsgUnix(buf, make([]byte, 1024))
					if err != nil || n == 0 {
						return
					}
					for _, reply := range script(conn, buf[:n]) {
						if reply == nil {
							return
						}
						if _, _, err := conn.WriteMsgUnix(reply, nil, nil); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return path
}

func helloAckFrame() []byte {
	b, _ := encodeServer(&serverMessage{HelloAck: &helloAck{ProtocolVersion: 1, ServerVersion: "test",
		Limits: limits{MaxFrameBytes: 262144, MaxFdsPerFrame: 64}}})
	return b
}

func TestRefusedAndWrongReplies(t *testing.T) {
	t.Run("refused handshake", func(t *testing.T) {
		path := scriptedPeer(t, func(_ *net.UnixConn, _ []byte) [][]byte {
			b, _ := encodeServer(&serverMessage{ProtocolError: &protocolError{Kind: 2, Message: "version 1 is not 2"}})
			return [][]byte{b, nil}
		})
		_, err := Dial(path)
		if err == nil || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "UnsupportedVersion: version 1 is not 2") {
			t.Errorf("Dial: %v", err)
		}
	})

	t.Run("wrong reply to a spawn", func(t *testing.T) {
		path := scriptedPeer(t, func(_ *net.UnixConn, frame []byte) [][]byte {
			// The connection speaks version 1, as helloAckFrame says.
			m, err := decodeClientIn(frame, 1)
			if err != nil {
				return [][]byte{nil}
			}
			if m.Hello != nil {
				return [][]byte{helloAckFrame()}
			}
			b, _ := encodeServer(&serverMessage{SignalSent: &signalSent{ID: m.Spawn.ID}})
			return [][]byte{b}
		})
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		err = c.Command("true").Start()
		var pe *ProtocolError
		if !errors.As(err, &pe) || !strings.Contains(err.Error(), "expected Spawned with 1 fds or SpawnFailed, got SignalSent") {
			t.Errorf("Start: %v", err)
		}
	})

	t.Run("malformed frame", func(t *testing.T) {
		path := scriptedPeer(t, func(_ *net.UnixConn, frame []byte) [][]byte {
			if m, err := decodeClient(frame); err == nil && m.Hello != nil {
				return [][]byte{helloAckFrame()}
			}
			return [][]byte{{0x04, 0x08, 0xff}}
		})
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		done := make(chan error, 1)
		go func() { _, err := c.Status(); done <- err }()
		select {
		case err := <-done:
			var ce *ConnectionError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), "expected a well-formed ServerMessage, got a malformed frame") {
				t.Errorf("Status: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Status hangs after a malformed reply")
		}
	})

	t.Run("reply for an unknown id", func(t *testing.T) {
		path := scriptedPeer(t, func(_ *net.UnixConn, frame []byte) [][]byte {
			if m, err := decodeClient(frame); err == nil && m.Hello != nil {
				return [][]byte{helloAckFrame()}
			}
			b, _ := encodeServer(&serverMessage{SignalSent: &signalSent{ID: 999}})
			return [][]byte{b}
		})
		c, err := Dial(path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Status(); err == nil || !strings.Contains(err.Error(), "SignalSent for unknown id 999") {
			t.Errorf("Status: %v", err)
		}
	})
}
