// The wiring of trainwatchd: options checked (server_options.cc), the store
// opened, state recovered, then the writer, the pager, the gRPC services and
// the exporter started; the services themselves live in agent_stream.cc,
// operator_service.cc and exporter.cc.

#include "daemon/server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/support/server_interceptor.h>
#include <prometheus/client_metric.h>
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#include <prometheus/metric_type.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "api/agent_stream.h"
#include "exporter/exporter.h"
#include "common/log.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "api/operator_service.h"
#include "api/service_state.h"
#include "api/standby_reads.h"
#include "admission/auth.h"
#include "daemon/lease_keeper.h"
#include "pager/pager.h"
#include "trainwatch/core/file_system.h"
#include "trainwatch/v1/agent.grpc.pb.h"

namespace trainwatch::server {

namespace v1 = trainwatch::v1;

bool IsLoopback(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]") || absl::StartsWith(address, "unix:") ||
         address == "localhost";
}

namespace {

constexpr char kReflectionPrefix[] = "/grpc.reflection.";

// Server reflection is the gRPC library's own service, which checks no
// token: with authentication on, a call to it without a valid token gets
// UNAUTHENTICATED, and what it would have sent is replaced by empty
// messages (a server interceptor cannot refuse a call outright).
class ReflectionAuth : public grpc::experimental::Interceptor {
 public:
  explicit ReflectionAuth(const Authenticator* auth) : auth_(auth) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    using grpc::experimental::InterceptionHookPoints;
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      std::string authorization;
      for (const auto& [key, value] : *m->GetRecvInitialMetadata()) {
        if (key == "authorization") authorization.assign(value.data(), value.size());
      }
      status_ = auth_->Check(authorization, Access::kAny).status();
    }
    if (!status_.ok()) {
      if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE)) {
        *m->GetSerializedSendMessage() = grpc::ByteBuffer();
      }
      if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
        m->ModifySendStatus(ToGrpc(status_));
      }
    }
    m->Proceed();
  }

 private:
  const Authenticator* auth_;
  absl::Status status_;
};

class ReflectionAuthFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit ReflectionAuthFactory(const Authenticator* auth) : auth_(auth) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    if (!absl::StartsWith(info->method(), kReflectionPrefix)) return nullptr;
    return new ReflectionAuth(auth_);
  }

 private:
  const Authenticator* auth_;
};

// Linking gRPC's reflection registers its plugin for every ServerBuilder of
// the process; this option takes it out of one builder (--reflection=false).
class WithoutReflection : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    const std::string name = grpc::reflection::ProtoServerReflectionPlugin().name();
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [&](const auto& p) { return p->name() == name; }),
                   plugins->end());
  }
};

// The pager's poster while this replica owns the shards: a replica whose
// lease lapsed (paused, cut off) sends no page, however briefly it runs on
// before it exits; the new owner's pager sends what is due.
class FencedPoster final : public HttpPoster {
 public:
  FencedPoster(HttpPoster* poster, const ShardLeases* leases) : poster_(poster), leases_(leases) {}
  absl::StatusOr<HttpResponse> Post(const std::string& url, const Headers& headers,
                                    const std::string& body, absl::Duration timeout) override {
    if (!leases_->MayAcknowledge(0)) {
      return absl::UnavailableError("fenced: this replica's lease lapsed");
    }
    return poster_->Post(url, headers, body, timeout);
  }

 private:
  HttpPoster* const poster_;
  const ShardLeases* const leases_;
};

// What the owner's /serving answers on the metrics port: a readiness probe
// (Kubernetes' httpGet) that only the replica taking agent streams passes;
// elsewhere the path is not found.
class ServingFlag final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    prometheus::ClientMetric m;
    m.gauge.value = 1;
    return {prometheus::MetricFamily{"trainwatch_serving",
                                     "1: this trainwatchd takes agent streams (a single one, or "
                                     "the replica owning the shards).",
                                     prometheus::MetricType::Gauge,
                                     {m}}};
  }
};

constexpr char kServingPath[] = "/serving";

}  // namespace

struct Server::Impl {
  ServerOptions options;
  core::Clock* clock = nullptr;
  LeaseKeeper* leases = nullptr;
  std::unique_ptr<Store> store;
  PagerConfig pager_config;
  std::unique_ptr<StandbyReads> standby;  // set while (and after) standing by
  std::unique_ptr<Ingestor> ingestor;
  std::unique_ptr<FencedPoster> fenced_poster;
  std::unique_ptr<Pager> pager;
  std::unique_ptr<ServiceState> state;
  std::unique_ptr<grpc::Service> agent_service;
  std::unique_ptr<grpc::Service> operator_service;
  std::unique_ptr<grpc::Server> grpc_server;
  std::shared_ptr<prometheus::Collectable> exporter;
  std::shared_ptr<prometheus::Collectable> serving_flag = std::make_shared<ServingFlag>();
  std::unique_ptr<prometheus::Exposer> exposer;
  int port = 0;
  int metrics_port = 0;
  bool shut_down = false;

  // The threads that call into `state` stop before it goes, also when
  // Start fails half-way (Shutdown stops them on every other path).
  ~Impl() {
    if (standby != nullptr) standby->Stop();
    if (ingestor != nullptr) ingestor->Stop();
    if (pager != nullptr) pager->Stop();
  }

  // The writer: engines from the store, the pager's outbox, then agent
  // streams and decisions taken.
  absl::Status StartWriter();
  // Says so on grpc.health.v1 and /serving.
  void MarkServing();
  // From now on an owner: the leases renewed, and their loss the end.
  void RenewLeases();
};

absl::Status Server::Impl::StartWriter() {
  HttpPoster* poster = DefaultHttpPoster();
  if (leases != nullptr) {
    fenced_poster = std::make_unique<FencedPoster>(poster, leases->leases());
    poster = fenced_poster.get();
  }
  pager = std::make_unique<Pager>(store.get(), pager_config, clock, poster);
  ingestor = std::make_unique<Ingestor>(store.get(), options.ingest, clock);
  ingestor->SetPager(pager.get());
  // Reads the runs only: their engines are rebuilt by the writer thread
  // after Start(), so the port opens at once (ingest.h "Restart").
  if (absl::Status s = ingestor->Recover(); !s.ok()) return s;
  ingestor->SetListener(state.get());
  ingestor->Start();
  pager->Start();
  state->SetWriter(ingestor.get(), pager.get());
  return absl::OkStatus();
}

void Server::Impl::MarkServing() {
  grpc_server->GetHealthCheckService()->SetServingStatus(v1::AgentService::service_full_name(),
                                                         true);
  if (exposer != nullptr) exposer->RegisterCollectable(serving_flag, kServingPath);
}

void Server::Impl::RenewLeases() {
  if (leases == nullptr) return;
  // Crash-only: a replica that lost its lease stops at once (the store's
  // fence already refuses its commits), and its restart is a standby.
  leases->StartRenewing([](const std::string& why) {
    LOG(ERROR) << "trainwatchd: fenced: " << why
               << "; exiting without acknowledging anything more (a restart is a standby)";
    std::fflush(nullptr);
    std::_Exit(3);
  });
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Shutdown(std::chrono::seconds(2)); }

int Server::port() const { return impl_->port; }
int Server::metrics_port() const { return impl_->metrics_port; }
Ingestor* Server::ingestor() { return impl_->ingestor.get(); }
Store* Server::store() { return impl_->store.get(); }
bool Server::standby() const { return impl_->state->writer() == nullptr; }

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      core::Clock* clock, LeaseKeeper* leases) {
  if (absl::Status s = CheckServerOptions(options); !s.ok()) return s;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->clock = clock;
  impl->leases = leases;
  Authenticator auth;
  if (!options.tokens_file.empty()) {
    absl::StatusOr<Authenticator> a = Authenticator::FromFile(options.tokens_file);
    if (!a.ok()) return a.status();
    auth = *std::move(a);
  }
  const bool tls = !options.tls_cert_file.empty();
  if (tls != !options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key file");
  }
  if (!options.tls_client_ca_file.empty() && !tls) {
    return absl::InvalidArgumentError("mutual TLS needs the server's certificate and key too");
  }
  if (!IsLoopback(options.listen)) {
    if (!tls) {
      LOG(WARNING) << "*** trainwatchd listens on " << options.listen
                   << " beyond loopback WITHOUT TLS: tokens and metrics travel in clear text. "
                      "Use --tls_cert/--tls_key. ***";
    }
    if (!auth.enabled()) {
      LOG(WARNING) << "*** trainwatchd listens on " << options.listen
                   << " beyond loopback WITHOUT AUTHENTICATION: anyone who reaches it can "
                      "stream records and read incidents. Use --tokens. ***";
    }
  }
  StoreOptions store_options = options.store;
  if (leases != nullptr) store_options.fence = leases->leases();
  absl::StatusOr<std::unique_ptr<Store>> store = Store::Open(options.db_path, store_options);
  if (!store.ok()) return store.status();
  impl->store = *std::move(store);
  // Read now, on a standby too: a bad file is said at the start, not at
  // the takeover.
  if (!options.pager_config_file.empty()) {
    absl::StatusOr<PagerConfig> pc = LoadPagerConfig(options.pager_config_file);
    if (!pc.ok()) return pc.status();
    impl->pager_config = *std::move(pc);
  }
  if (impl->pager_config.grafana_url.empty()) impl->pager_config.grafana_url = options.grafana_url;
  impl->state = std::make_unique<ServiceState>(nullptr, impl->store.get(), nullptr,
                                               std::move(auth), clock, options.grafana_url,
                                               options.ingest);
  const bool standby =
      leases != nullptr && leases->leases()->owned() < leases->leases()->shards();
  if (standby) {
    impl->standby = std::make_unique<StandbyReads>(impl->store.get(), impl->state.get(), clock,
                                                   options.standby_refresh_ms);
    impl->state->SetStandby(impl->standby.get(), options.replica,
                            [leases] { return leases->owner(); });
    impl->standby->Start();
  } else if (absl::Status s = impl->StartWriter(); !s.ok()) {
    return s;
  }

  AgentStreamLimits limits;
  limits.max_world_size = options.max_world_size;
  impl->agent_service =
      NewAgentService(impl->state.get(), limits, options.max_runs_per_token);
  impl->operator_service = NewOperatorService(impl->state.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (!options.reflection) builder.SetOption(std::make_unique<WithoutReflection>());
  if (impl->state->auth().enabled()) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
    creators.push_back(std::make_unique<ReflectionAuthFactory>(&impl->state->auth()));
    builder.experimental().SetInterceptorCreators(std::move(creators));
  }
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (tls) {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca_file.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    const core::LocalFileSystem fs;
    absl::StatusOr<std::string> cert = fs.ReadFile(options.tls_cert_file);
    absl::StatusOr<std::string> key = fs.ReadFile(options.tls_key_file);
    if (!cert.ok()) return cert.status();
    if (!key.ok()) return key.status();
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls_client_ca_file.empty()) {
      absl::StatusOr<std::string> ca = fs.ReadFile(options.tls_client_ca_file);
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
    }
    creds = grpc::SslServerCredentials(ssl);
  }
  builder.AddListeningPort(options.listen, creds, &impl->port);
  builder.RegisterService(impl->agent_service.get());
  builder.RegisterService(impl->operator_service.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, options.keepalive_time_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, options.keepalive_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  // Without this a second trainwatchd on the same port would share it
  // silently (SO_REUSEPORT) and split the agents between two databases.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  impl->grpc_server = builder.BuildAndStart();
  if (impl->grpc_server == nullptr || impl->port == 0) {
    if (impl->ingestor != nullptr) impl->ingestor->Stop();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid)"));
  }
  if (!options.metrics_listen.empty()) {
    try {
      // prometheus-cpp reports a bind failure by throwing; it stops here.
      impl->exposer = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      impl->grpc_server->Shutdown();
      if (impl->ingestor != nullptr) impl->ingestor->Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", options.metrics_listen, ": ", e.what()));
    }
    std::function<LeaseFigures()> figures;
    if (leases != nullptr) {
      figures = [leases] {
        const ShardLeases& l = *leases->leases();
        LeaseFigures f;
        f.shards_owned = l.owned();
        f.shards_total = l.shards();
        for (int s = 0; s < l.shards(); ++s) f.epoch = std::max(f.epoch, l.epoch(s));
        f.takeovers = leases->takeovers();
        return f;
      };
    }
    impl->exporter = NewExporter(impl->state.get(), options.metrics, std::move(figures));
    impl->exposer->RegisterCollectable(impl->exporter);
    const std::vector<int> ports = impl->exposer->GetListeningPorts();
    impl->metrics_port = ports.empty() ? 0 : ports.front();
  }
  LOG(INFO) << "trainwatchd: gRPC on port " << impl->port << ", metrics on port "
            << impl->metrics_port << ", database "
            // A conninfo may hold a password: only a file's name is logged.
            << (Store::IsPostgres(options.db_path) ? std::string("PostgreSQL") : options.db_path)
            << ", authentication "
            << (impl->state->auth().enabled() ? "on" : "off") << ", TLS "
            << (tls ? (options.tls_client_ca_file.empty() ? "on" : "mutual") : "off")
            << ", reflection "
            << (!options.reflection ? "off" : impl->state->auth().enabled() ? "token" : "on");
  // The health service says SERVING for "" (the process is up) and for the
  // agent service only where records are taken.
  impl->grpc_server->GetHealthCheckService()->SetServingStatus(
      v1::AgentService::service_full_name(), false);
  if (standby) {
    LOG(INFO) << "trainwatchd: standby replica " << options.replica
              << ": serving operator reads from the store; agent streams and decisions go to "
                 "the owner";
  } else {
    impl->MarkServing();
    impl->RenewLeases();
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

absl::Status Server::TakeOver() {
  if (!standby()) return absl::FailedPreconditionError("TakeOver: not a standby");
  // Renewed from the moment they are owned: what follows may take longer
  // than the lease leaves.
  impl_->RenewLeases();
  // A last refresh: watchers hear of the old owner's last changes before
  // the writer tells its own.
  impl_->standby->Stop();
  if (absl::Status s = impl_->standby->Refresh(); !s.ok()) {
    LOG(WARNING) << "standby: the last refresh before the takeover: " << s;
  }
  if (absl::Status s = impl_->StartWriter(); !s.ok()) return s;
  impl_->MarkServing();
  return absl::OkStatus();
}

void Server::Shutdown(std::chrono::milliseconds deadline) {
  if (impl_ == nullptr || impl_->shut_down) return;
  impl_->shut_down = true;
  // Streams get until the deadline to finish; what they sent is written.
  impl_->grpc_server->Shutdown(std::chrono::system_clock::now() + deadline);
  if (impl_->standby != nullptr) impl_->standby->Stop();
  if (impl_->ingestor != nullptr) {
    impl_->ingestor->Flush();
    impl_->ingestor->Stop();
    impl_->pager->Stop();
  }
  impl_->exposer.reset();
  LOG(INFO) << "trainwatchd: stopped; store flushed";
}

}  // namespace trainwatch::server
