# hotload's one Dockerfile, two targets (CONTRACTS.md, "Images"):
#
#   hotload            the operator and the sidecar (`hotload operator`, `hotload sidecar`); no torch
#   hotload-reference  the same plus torch, transformers and peft, for the reference engine
#
#   docker build --target hotload -t hotload:0.1.0 .
#   docker build --target hotload-reference -t hotload-reference:0.1.0 .
#
# Both run as uid/gid 10001 with `hotload` as the entry point and write nothing outside /tmp
# (HOME=/tmp; bytecode is compiled at install and never written at run time), so a
# read-only root filesystem with an emptyDir at /tmp works. Python packages are installed
# with the exact pins of constraints.txt; the dependencies and hotload itself are separate
# layers, so a change to hotload's code rebuilds and ships a few megabytes, not the stack.
# Without a Docker engine, hack/build-image builds this same file with buildah, handing it
# a Debian base made with debootstrap (`--from`), since no registry can be reached there;
# that base is what the pinned one below is: a Debian bookworm "minbase", slimmed.

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

# A virtualenv of the dependencies alone: rebuilt only when the pins change. The compiler
# builds hotload's one native module (the context codec's kernels) and stays here.
FROM base AS builder
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv python3-dev gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && python3 -m venv /opt/hotload
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_WARN_SCRIPT_LOCATION=1
WORKDIR /src
COPY pyproject.toml constraints.txt ./
RUN python3 -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/core.txt', 'w').write('\n'.join(deps) + '\n')" \
 && /opt/hotload/bin/pip install -c constraints.txt -r /tmp/core.txt

FROM builder AS reference-deps
RUN python3 -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['reference']; open('/tmp/reference.txt', 'w').write('\n'.join(deps) + '\n')" \
 && /opt/hotload/bin/pip install -c constraints.txt -r /tmp/reference.txt \
 && /opt/hotload/bin/python -m pip uninstall -q -y pip setuptools

# The installers leave with the build: the images need neither pip nor setuptools.
FROM builder AS core-deps
RUN /opt/hotload/bin/python -m pip uninstall -q -y pip setuptools

# hotload itself, installed on its own: the package (its native module compiled), its
# metadata and its `hotload` script.
FROM builder AS app
COPY README.md setup.py ./
COPY hotload ./hotload
RUN /opt/hotload/bin/pip install --no-deps --no-compile --target /opt/app . \
 && /opt/hotload/bin/python -m compileall -q /opt/app/hotload \
 && mkdir -p /opt/app-bin && mv /opt/app/bin/hotload /opt/app-bin/ && rmdir /opt/app/bin

FROM base AS hotload
COPY --from=core-deps /opt/hotload /opt/hotload
COPY --from=app /opt/app /opt/hotload/lib/python3.11/site-packages
COPY --from=app /opt/app-bin/hotload /opt/hotload/bin/hotload
ENV HOME=/tmp
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["hotload"]
CMD ["--help"]

FROM base AS hotload-reference
COPY --from=reference-deps /opt/hotload /opt/hotload
COPY --from=app /opt/app /opt/hotload/lib/python3.11/site-packages
COPY --from=app /opt/app-bin/hotload /opt/hotload/bin/hotload
ENV HOME=/tmp
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["hotload"]
CMD ["--help"]
