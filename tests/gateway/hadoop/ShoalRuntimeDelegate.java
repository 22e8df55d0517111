// The JAX-RS RuntimeDelegate that Hadoop's WebHdfsFileSystem needs and its shaded
// client jars do not ship: it parses the Content-Type of every answer with
// MediaType.valueOf, which asks the RuntimeDelegate for a header delegate (Jersey's,
// absent from hadoop-client-runtime). Only MediaType is ever asked for.
// Selected with -Dorg.apache.hadoop.shaded.javax.ws.rs.ext.RuntimeDelegate=ShoalRuntimeDelegate.

import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.hadoop.shaded.javax.ws.rs.core.Application;
import org.apache.hadoop.shaded.javax.ws.rs.core.Link;
import org.apache.hadoop.shaded.javax.ws.rs.core.MediaType;
import org.apache.hadoop.shaded.javax.ws.rs.core.Response;
import org.apache.hadoop.shaded.javax.ws.rs.core.UriBuilder;
import org.apache.hadoop.shaded.javax.ws.rs.core.Variant;
import org.apache.hadoop.shaded.javax.ws.rs.ext.RuntimeDelegate;

public class ShoalRuntimeDelegate extends RuntimeDelegate {
  static final class MediaTypes implements RuntimeDelegate.HeaderDelegate<MediaType> {
    @Override
    public MediaType fromString(String value) {
      if (value == null) throw new IllegalArgumentException("no media type");
      String[] parts = value.split(";");
      String[] tv = parts[0].trim().split("/", 2);
      Map<String, String> params = new LinkedHashMap<>();
      for (int i = 1; i < parts.length; i++) {
        String[] kv = parts[i].trim().split("=", 2);
        if (kv.length == 2) params.put(kv[0].trim().toLowerCase(), kv[1].trim().replace("\"", ""));
      }
      return new MediaType(tv[0], tv.length > 1 ? tv[1] : "*", params);
    }

    @Override
    public String toString(MediaType m) {
      StringBuilder b = new StringBuilder(m.getType()).append('/').append(m.getSubtype());
      for (Map.Entry<String, String> e : m.getParameters().entrySet())
        b.append(';').append(e.getKey()).append('=').append(e.getValue());
      return b.toString();
    }
  }

  @Override
  @SuppressWarnings("unchecked")
  public <T> RuntimeDelegate.HeaderDelegate<T> createHeaderDelegate(Class<T> type) {
    if (type == MediaType.class) return (RuntimeDelegate.HeaderDelegate<T>) new MediaTypes();
    throw new UnsupportedOperationException(type.getName());
  }

  @Override
  public UriBuilder createUriBuilder() { throw new UnsupportedOperationException(); }

  @Override
  public Response.ResponseBuilder createResponseBuilder() { throw new UnsupportedOperationException(); }

  @Override
  public Variant.VariantListBuilder createVariantListBuilder() { throw new UnsupportedOperationException(); }

  @Override
  public <T> T createEndpoint(Application app, Class<T> type) { throw new UnsupportedOperationException(); }

  @Override
  public Link.Builder createLinkBuilder() { throw new UnsupportedOperationException(); }
}
