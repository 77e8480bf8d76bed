# hotload's one Dockerfile, two targets (CONTRACTS.md, "Images"):
#
#   hotload            the operator and the sidecar (`hotload operator`, `hotload sidecar`); no torch
#   hotload-reference  the same plus torch, transformers and peft, for the reference engine
#
#   docker build --target hotload -t hotload:0.1.0 .
#   docker build --target hotload-reference -t hotload-reference:0.1.0 .
#
# Both run as uid/gid 10001 with `hotload` as the entry point and write nothing outside /tmp
# (HOME=/tmp, no bytecode written at run time), so a read-only root filesystem with an
# emptyDir at /tmp works. Python packages are installed with the exact pins of
# constraints.txt. Without a Docker engine, hack/build-image builds this same file with
# buildah, handing it a Debian base made with debootstrap (`--from`), since no registry can be
# reached there; that base is what the pinned one below is: a Debian bookworm "minbase".

FROM debian:bookworm-20250520-slim AS base
ENV LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/hotload/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && groupadd --gid 10001 hotload \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp --shell /usr/sbin/nologin hotload

# The virtualenv is built here and only copied into the final images (no pip, no build
# tools there). Dependencies come first, in their own layer: a change to hotload's code
# reinstalls hotload alone.
FROM base AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && python3 -m venv /opt/hotload
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1
WORKDIR /src
COPY pyproject.toml constraints.txt ./
RUN python3 -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/core.txt', 'w').write('\n'.join(deps) + '\n')" \
 && /opt/hotload/bin/pip install -c constraints.txt -r /tmp/core.txt
COPY README.md ./
COPY hotload ./hotload
RUN /opt/hotload/bin/pip install --no-deps . \
 && /opt/hotload/bin/python -m compileall -q /opt/hotload \
 && rm -rf /src/build

FROM builder AS reference-builder
RUN python3 -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['reference']; open('/tmp/reference.txt', 'w').write('\n'.join(deps) + '\n')" \
 && /opt/hotload/bin/pip install -c constraints.txt -r /tmp/reference.txt \
 && /opt/hotload/bin/python -m compileall -q /opt/hotload

FROM base AS hotload
COPY --from=builder /opt/hotload /opt/hotload
ENV HOME=/tmp
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["hotload"]
CMD ["--help"]

FROM base AS hotload-reference
COPY --from=reference-builder /opt/hotload /opt/hotload
ENV HOME=/tmp
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["hotload"]
CMD ["--help"]
