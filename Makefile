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

# What the project made on this machine (./dev clean says what it removes); Debian packages stay.
clean:
	./dev clean
