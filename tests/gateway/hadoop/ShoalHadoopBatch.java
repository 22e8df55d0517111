// Runs several Hadoop client commands in one JVM (a JVM start costs a second or more),
// each followed on stdout by a line "@@shoal rc=N". Commands are separated by "::".
// A command is either FsShell's arguments (-ls -R /ds, -cat /f, ...) or
// "blocks PATH": what FileSystem.getFileBlockLocations reports, one block a line,
// "offset length host,host" (FsShell has no command for it; Spark's and MapReduce's
// input formats call it to place tasks near the data).
// Usage: java ... ShoalHadoopBatch webhdfs://HOST:PORT CMD [:: CMD ...]

import java.net.URI;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.BlockLocation;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.FsShell;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.util.ToolRunner;

public class ShoalHadoopBatch {
  public static void main(String[] args) throws Exception {
    URI uri = new URI(args[0]);
    Configuration conf = new Configuration();
    FileSystem.setDefaultUri(conf, uri);
    List<List<String>> commands = new ArrayList<>();
    List<String> cur = new ArrayList<>();
    for (String a : Arrays.copyOfRange(args, 1, args.length)) {
      if (a.equals("::")) { commands.add(cur); cur = new ArrayList<>(); } else cur.add(a);
    }
    commands.add(cur);
    for (List<String> cmd : commands) {
      int rc;
      try {
        if (cmd.get(0).equals("blocks")) {
          FileSystem fs = FileSystem.get(uri, conf);
          FileStatus st = fs.getFileStatus(new Path(cmd.get(1)));
          for (BlockLocation b : fs.getFileBlockLocations(st, 0, st.getLen()))
            System.out.println(b.getOffset() + " " + b.getLength() + " " + String.join(",", b.getHosts()));
          rc = 0;
        } else {
          rc = ToolRunner.run(new FsShell(conf), cmd.toArray(new String[0]));
        }
      } catch (Exception e) {
        e.printStackTrace();
        rc = 99;
      }
      System.out.flush();
      System.err.flush();
      System.out.println("@@shoal rc=" + rc);
      System.out.flush();
    }
  }
}
