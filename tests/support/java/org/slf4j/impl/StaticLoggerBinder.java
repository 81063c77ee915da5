package org.slf4j.impl;

import java.lang.reflect.Proxy;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentMap;

import org.slf4j.ILoggerFactory;
import org.slf4j.Logger;
import org.slf4j.Marker;
import org.slf4j.helpers.FormattingTuple;
import org.slf4j.helpers.MessageFormatter;
import org.slf4j.spi.LoggerFactoryBinder;

/**
 * A minimal slf4j 1.7 binding for KafkaCheck: without any binding slf4j prints a three-line warning and drops every
 * log line, and the client's WARN/ERROR lines (error codes the broker returned, retries) are exactly what explains a
 * failing check. Lines at or above the level in the system property {@code kafkacheck.log.level} (default WARN) go to
 * stderr.
 */
public final class StaticLoggerBinder implements LoggerFactoryBinder {
    public static String REQUESTED_API_VERSION = "1.7.36";

    private static final List<String> LEVELS = Arrays.asList("TRACE", "DEBUG", "INFO", "WARN", "ERROR");
    // Declared after LEVELS: the constructor reads it.
    private static final StaticLoggerBinder SINGLETON = new StaticLoggerBinder();

    private final ILoggerFactory factory = new StderrLoggerFactory(
            Math.max(0, LEVELS.indexOf(System.getProperty("kafkacheck.log.level", "WARN").toUpperCase())));

    public static StaticLoggerBinder getSingleton() {
        return SINGLETON;
    }

    @Override
    public ILoggerFactory getLoggerFactory() {
        return factory;
    }

    @Override
    public String getLoggerFactoryClassStr() {
        return StderrLoggerFactory.class.getName();
    }

    private static final class StderrLoggerFactory implements ILoggerFactory {
        private final int threshold;
        private final ConcurrentMap<String, Logger> loggers = new ConcurrentHashMap<>();

        StderrLoggerFactory(int threshold) {
            this.threshold = threshold;
        }

        @Override
        public Logger getLogger(String name) {
            return loggers.computeIfAbsent(name, this::create);
        }

        // org.slf4j.Logger has some sixty overloads that differ only in level and argument shape; one handler that
        // reads the level from the method name covers them all.
        private Logger create(String name) {
            String shortName = name.substring(name.lastIndexOf('.') + 1);
            return (Logger) Proxy.newProxyInstance(Logger.class.getClassLoader(), new Class<?>[] {Logger.class},
                    (proxy, method, args) -> {
                        String methodName = method.getName();
                        if (methodName.equals("getName")) {
                            return name;
                        }
                        if (methodName.equals("toString")) {
                            return "StderrLogger[" + name + "]";
                        }
                        if (methodName.equals("hashCode")) {
                            return System.identityHashCode(proxy);
                        }
                        if (methodName.equals("equals")) {
                            return proxy == args[0];
                        }
                        boolean query = methodName.startsWith("is") && methodName.endsWith("Enabled");
                        String levelName = query
                                ? methodName.substring(2, methodName.length() - "Enabled".length()).toUpperCase()
                                : methodName.toUpperCase();
                        int level = LEVELS.indexOf(levelName);
                        boolean enabled = level >= threshold;
                        if (query) {
                            return enabled;
                        }
                        if (!enabled || args == null || args.length == 0) {
                            return null;
                        }
                        int first = args[0] instanceof Marker ? 1 : 0;
                        String pattern = String.valueOf(args[first]);
                        Object[] rest = Arrays.copyOfRange(args, first + 1, args.length);
                        if (rest.length == 1 && rest[0] instanceof Object[]) {
                            rest = (Object[]) rest[0];
                        }
                        FormattingTuple tuple = rest.length == 1 && rest[0] instanceof Throwable
                                ? new FormattingTuple(pattern, null, (Throwable) rest[0])
                                : MessageFormatter.arrayFormat(pattern, rest);
                        synchronized (System.err) {
                            System.err.println("[java " + levelName + " " + shortName + "] " + tuple.getMessage());
                            if (tuple.getThrowable() != null) {
                                tuple.getThrowable().printStackTrace(System.err);
                            }
                        }
                        return null;
                    });
        }
    }
}
