# Shortcuts for ./dev, the primary entry point (make may be absent on a fresh Debian; ./dev is not).
# Each target installs what it needs with apt, as ./dev does.

.PHONY: test deb integration run clean

test:
	./dev test

deb:
	./dev deb

integration:
	./dev integration

run:
	./dev run

# Build output only; the VM image cache (/var/cache/elasticd-integration) is kept: delete it by hand
# to force a cold image build.
clean:
	rm -rf dist build
