# The operator image. No container engine runs on our development machines, so this file is not built or
# tested here; `evalctl operator` itself is tested against a real API server (tests/kube).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends openssh-client tini && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home evalctl
WORKDIR /app
COPY pyproject.toml README.md ./
COPY controller ./controller
RUN pip install --no-cache-dir .
USER 10001
ENTRYPOINT ["tini", "--", "evalctl"]  # PID 1 reaps what ends under it (local runners, ssh masters)
CMD ["operator"]
