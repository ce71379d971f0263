// Helper for scripts/dev-kafka.sh, compiled by its `install` against the broker's own jars
// (kafka-clients' Admin API; the kafka-tools artifact would pull in all of Kafka Connect).
//
//   SvcKafkaTool create-topics BOOTSTRAP PARTITIONS TOPIC...
//       creates the topics that are missing (replication factor: the cluster's default) and
//       leaves existing ones alone; prints one line per topic. Idempotent.
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.errors.TopicExistsException;

public final class SvcKafkaTool {
    public static void main(String[] args) throws Exception {
        if (args.length < 4 || !args[0].equals("create-topics")) {
            System.err.println("usage: SvcKafkaTool create-topics BOOTSTRAP PARTITIONS TOPIC...");
            System.exit(2);
        }
        String bootstrap = args[1];
        int partitions = Integer.parseInt(args[2]);
        List<String> topics = List.of(args).subList(3, args.length);
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        try (Admin admin = Admin.create(props)) {
            Set<String> existing = admin.listTopics().names().get(30, TimeUnit.SECONDS);
            List<NewTopic> missing = new ArrayList<>();
            for (String t : topics) {
                if (!existing.contains(t)) missing.add(new NewTopic(t, Optional.of(partitions), Optional.empty()));
            }
            if (!missing.isEmpty()) {
                for (var e : admin.createTopics(missing).values().entrySet()) {
                    try {
                        e.getValue().get(30, TimeUnit.SECONDS);
                    } catch (ExecutionException ex) {
                        if (!(ex.getCause() instanceof TopicExistsException)) throw ex;
                    }
                }
            }
            Map<String, TopicDescription> described =
                admin.describeTopics(topics).allTopicNames().get(30, TimeUnit.SECONDS);
            for (String t : topics) {
                TopicDescription d = described.get(t);
                boolean created = missing.stream().anyMatch(n -> n.name().equals(t));
                System.out.printf("%s %s partitions=%d replicas=%d%n", created ? "created" : "exists ", t,
                    d.partitions().size(), d.partitions().get(0).replicas().size());
            }
        }
    }
}
